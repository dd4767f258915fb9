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


def count(n: int = 10, every: float = 1.0):
    """Print a numbered line every `every` seconds, `n` of them, then return n: a job to
    watch with `lakeshore jobs logs JOB --follow`."""
    n, every = int(n), float(every)
    if n < 0 or every < 0:
        raise ValueError(f"n and every must be 0 or more, got {n} and {every}")
    for i in range(1, n + 1):
        print(f"{i}/{n}", flush=True)
        if i < n:
            time.sleep(every)
    return n


def fail(message: str = "failed on purpose"):
    """Raise, so the invocation ends failed with this message and a traceback."""
    raise RuntimeError(message)
