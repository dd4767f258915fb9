"""Which token registered a daemon (issue 29, item 8): a token holds at most
LAKESHORE_DAEMONS_PER_TOKEN live daemons. SDK workers' rows already name the token they
polled with, which registered them; a daemon registered before this is counted by none."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0006_notify_credential_changes"),
        ("fleet", "0004_notify_daemon_end"),
    ]

    operations = [
        migrations.AddField(
            model_name="daemon",
            name="registered_with",
            field=models.ForeignKey(
                blank=True,
                help_text="The token that registered it (a bootstrap daemon token, or the token an SDK worker first polled with): it may hold LAKESHORE_DAEMONS_PER_TOKEN live daemons at once. Empty for a provider's daemons, which their provider made.",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="accounts.apitoken",
            ),
        ),
        migrations.RunSQL(
            "UPDATE queues_daemon SET registered_with_id = token_id "
            "WHERE worker_id IS NOT NULL AND token_id IS NOT NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
