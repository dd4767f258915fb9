"""Fleet's tables take fleet's name (issue 30): queues_provider, queues_daemon and
queues_daemoncommand, named when these models lived in queues/, become fleet_provider,
fleet_daemon and fleet_daemoncommand. A rename keeps every row, index, constraint,
trigger and sequence, which PostgreSQL ties to the table itself, not to its name; their
own names (queues_daemon_pkey, queues_daemon_id_seq, ...) are left as they are: Django
finds them by introspection, and nothing reads them by name. The one thing that names a
table in its text is the token-revoked trigger's function (0004): it is written again
with the new name. The models now name no table: each takes its app's default."""

from django.db import migrations

REVOKED_NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION lakeshore_notify_token_revoked() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'daemon:' || d.id::text)
       FROM {daemon_table} d WHERE d.token_id = NEW.id;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("fleet", "0006_registered_with_and_provider_observed")]

    operations = [
        migrations.AlterModelTable(name="provider", table=None),
        migrations.AlterModelTable(name="daemon", table=None),
        migrations.AlterModelTable(name="daemoncommand", table=None),
        migrations.RunSQL(
            REVOKED_NOTIFY_FUNCTION.format(daemon_table="fleet_daemon"),
            REVOKED_NOTIFY_FUNCTION.format(daemon_table="queues_daemon"),
        ),
    ]
