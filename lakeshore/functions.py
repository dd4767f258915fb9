"""Functions every daemon may run, whatever LAKESHORE_ALLOWED_MODULES says: for smoke
tests and for checking a queue end to end."""

import time


def echo(*args, **kwargs):
    """Return what it was given."""
    return {"args": list(args), "kwargs": kwargs}


def sleep(seconds: float = 1.0):
    """Sleep, then return how long it slept."""
    seconds = float(seconds)
    if seconds < 0:
        raise ValueError(f"seconds must be 0 or more, got {seconds}")
    time.sleep(seconds)
    return seconds


def fail(message: str = "failed on purpose"):
    """Raise, so the invocation ends failed with this message and a traceback."""
    raise RuntimeError(message)
