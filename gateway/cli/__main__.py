"""`python -m gateway.cli ...`: the `tokenwire` console script."""
import sys

from gateway.cli import main

sys.exit(main())
