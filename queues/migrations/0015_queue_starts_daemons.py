"""Whether the controller starts a queue's daemons, computed by the database (issue 30):
one rule that a submit's INSERT and the controller's wake both read."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0014_metric_total"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="starts_daemons",
            field=models.GeneratedField(
                db_persist=True,
                expression=models.Q(
                    ("provider__isnull", False),
                    models.Q(("elasticity_kind", ""), _negated=True),
                    models.Q(("state", "archived"), _negated=True),
                ),
                help_text="The controller starts its daemons: it has a provider and an "
                "elasticity declaration, and is not archived.",
                output_field=models.BooleanField(),
            ),
        ),
    ]
