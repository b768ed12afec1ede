"""How big the heavy tests run: a size that proves the behaviour in CI's time, or with
TOKENWIRE_FULL_SIZE=1 the size whose figures the docs quote."""
import os

FULL_SIZE = os.environ.get("TOKENWIRE_FULL_SIZE") == "1"


def size(ci: int, full: int) -> int:
    return full if FULL_SIZE else ci
