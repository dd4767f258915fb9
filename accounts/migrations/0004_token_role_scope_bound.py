"""Tokens carry their own role (issue 17): each existing token keeps the role its user
has now (operator, else daemon, else viewer), a queue scope (none: any queue) and
whether it is a daemon's own credential (provider-minted tokens of live daemons are)."""

import django.contrib.postgres.fields
from django.db import migrations, models


def roles_from_users(apps, schema_editor):
    ApiToken = apps.get_model("accounts", "ApiToken")
    for token in ApiToken.objects.select_related("user").iterator():
        user = token.user
        groups = set(user.groups.values_list("name", flat=True))
        if user.is_superuser or user.is_staff or "operator" in groups:
            role = "operator"
        elif "daemon" in groups:
            role = "daemon"
        else:
            role = "viewer"
        ApiToken.objects.filter(pk=token.pk).update(role=role)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_audit_target_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="role",
            field=models.CharField(
                choices=[
                    ("viewer", "viewer (read)"),
                    ("operator", "operator (read and act)"),
                    ("daemon", "daemon (daemon protocol only)"),
                ],
                default="viewer",
                help_text="What this token may do, never more than its user may (accounts/roles.py).",
                max_length=16,
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="apitoken",
            name="queues",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=63),
                blank=True,
                help_text="A daemon token scoped to queues registers daemons on these only; empty (null) means any queue.",
                null=True,
                size=None,
            ),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="bound",
            field=models.BooleanField(
                default=False,
                help_text="A daemon's own credential: it acts only for the daemon whose token it is (queues.Daemon.token), and registers no other daemon.",
            ),
        ),
        migrations.RunPython(roles_from_users, migrations.RunPython.noop),
    ]
