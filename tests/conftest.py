"""Suite-wide settings, applied before any test module imports torch."""
import os

# The engine's OpenMP threads share 2 cores with the server's event loop and the test's
# clients; spinning workers then starve the one doing the work and a step takes several
# times longer. Passive waiting yields the core instead (see gateway/cli.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
