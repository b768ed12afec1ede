"""What every tokenwire package may import: the bottom of the import graph (it imports
none of them). Kept to small, dependency-free pieces that more than one layer needs."""
