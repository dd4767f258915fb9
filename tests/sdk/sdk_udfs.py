"""UDFs for the SDK tests. The producer (the test) and the SDK's worker (a subprocess
with the project on PYTHONPATH) both import this module."""

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
