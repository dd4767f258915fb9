"""UDFs for the tests that drive the real Python SDK (the SDK's own, the CLI's `auth env
--sdk`, the local provider's daemons). The producer (the test) and the SDK's worker (a
subprocess with the project on PYTHONPATH) both import this module."""

import os
import time

import dreamlake.lakeshore as dls


@dls.udf(queue="gpu")
def add(a, b):
    return {"sum": a + b, "pair": (a, b)}


@dls.udf(queue="gpu")
def boom(x):
    return 1 / x


@dls.udf(queue="gpu")
def count(n):
    for i in range(n):
        yield {"i": i, "sq": i * i}


@dls.udf(queue="gpu")
def slow_count(n, pause):
    for i in range(n):
        time.sleep(pause)
        yield {"i": i}


@dls.udf(queue="gpu")
def nap(seconds):
    time.sleep(seconds)
    return "rested"


@dls.udf(queue="gpu")
def chatty(n):
    for i in range(n):
        print(f"sdk line {i}")
    return n


@dls.udf(queue="gpu")
def count_failing_first(n, marker):
    """Yields n values; its first run (no `marker` file yet) raises after the first."""
    for i in range(n):
        if i == 1 and not os.path.exists(marker):
            open(marker, "w").close()  # noqa: SIM115 - an empty marker, closed at once
            raise RuntimeError("the first attempt fails")
        yield {"i": i}


@dls.udf(queue="gpu")
def count_failing(n):
    """Yields one value, then raises, whichever attempt runs it."""
    for i in range(n):
        if i == 1:
            raise RuntimeError(f"attempt fails after {i}")
        yield {"i": i}
