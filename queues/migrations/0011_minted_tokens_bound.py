"""Provider-minted daemon tokens become their daemon's own credential (issue 17): they
act only for the daemon they were minted for."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0004_token_role_scope_bound"),
        ("queues", "0010_daemon_current_invocation_derived"),
    ]

    operations = [
        migrations.RunSQL(
            """UPDATE accounts_apitoken SET bound = true
                WHERE id IN (SELECT token_id FROM queues_daemon
                              WHERE token_id IS NOT NULL AND provider_id IS NOT NULL)""",
            migrations.RunSQL.noop,
        ),
    ]
