"""The no-op job RQ's workers run (`bench.compare.rq_job.noop`). Standard library only:
RQ's default worker forks a work horse per job, which imports the job's module, so this
one stays as light as a module can be."""


def noop(i: int) -> None:
    return None
