"""Fleet's tables take fleet's name (fleet/migrations/0007_tables_named_for_fleet.py):
rows stored under the old names (queues_provider, queues_daemon, queues_daemoncommand)
are found under the new ones, and revoking a daemon's token afterwards still runs its
trigger, whose function names the daemon table."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from accounts.models import ApiToken
from accounts.services import token_create
from fleet.models import Daemon, DaemonCommand, Provider
from tests.support import builders

BEFORE = [("fleet", "0006_registered_with_and_provider_observed")]


def _insert(sql: str, params: list) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def _tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


@pytest.mark.django_db(transaction=True)
def test_rows_stored_under_the_old_table_names_are_there_under_the_new_ones():
    token, _ = token_create(username="alice", role="operator")
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        assert {"queues_provider", "queues_daemon", "queues_daemoncommand"} <= _tables()
        now = timezone.now()
        provider = _insert(
            "INSERT INTO queues_provider (name, kind, description, config, observed,"
            " created_at, updated_at) VALUES ('sim', 'simulated', '', '{}', '{}', %s, %s)"
            " RETURNING id",
            [now, now],
        )
        daemon = _insert(
            "INSERT INTO queues_daemon (name, queues, state, provider_id, instance_type,"
            " external_id, log_path, token_id, last_heartbeat_at, created_at, updated_at)"
            " VALUES ('d-1', ARRAY['train'], 'idle', %s, '', 'ext-1', '', %s, %s, %s, %s)"
            " RETURNING id",
            [provider, token.pk, now, now, now],
        )
        command = _insert(
            "INSERT INTO queues_daemoncommand (daemon_id, invocation_id, verb, signal,"
            " requested_by, created_at, result) VALUES (%s, 12345, 'signal', 'TERM',"
            " 'alice via the API', %s, '') RETURNING id",
            [daemon, now],
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    tables = _tables()
    assert {"fleet_provider", "fleet_daemon", "fleet_daemoncommand"} <= tables
    assert not tables & {"queues_provider", "queues_daemon", "queues_daemoncommand"}
    found = Daemon.objects.select_related("provider").get(pk=daemon)
    assert (found.name, found.queues, found.external_id) == ("d-1", ["train"], "ext-1")
    assert found.provider == Provider.objects.get(pk=provider, name="sim")
    assert found.token_id == token.pk
    order = DaemonCommand.objects.get(pk=command)
    assert (order.daemon_id, order.invocation_id, order.requested_by) == (
        daemon,
        12345,
        "alice via the API",
    )
    # the token-revoked trigger reads the daemon table by name: it runs on the new one
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    # and new rows take ids after the old ones (each table kept its sequence)
    assert builders.daemon(queues=["train"]).pk > daemon
