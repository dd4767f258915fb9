"""The daemon fixtures of tests/daemon/test_daemon_faults.py (`daemons`, with each
`isolation`), for the other modules here that start daemons the same way."""

from tests.daemon.test_daemon_faults import daemons, isolation  # noqa: F401
