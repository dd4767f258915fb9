"""The daemon fixtures of tests/e2e/test_daemon_faults.py (`daemons`, with each
`isolation`), for the other modules here that start daemons the same way."""

from tests.e2e.test_daemon_faults import daemons, isolation  # noqa: F401
