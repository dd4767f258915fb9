"""Issue 29: result frames are kept per attempt (a retry writes its own stream; a reader
is shown the latest attempt's), a stream records the credential that opened it (a topic
takes frames from it only), and TopicWriter counts what each credential's topics hold.
Frames stored before this belong to the attempt their invocation is at now (a topic's
attempt is 0)."""

from django.db import migrations, models

# The frames and totals of an invocation's stream, stored before attempts were kept.
_ADOPT_ATTEMPTS = """
UPDATE jobs_resultframe f SET attempt = GREATEST(i.attempts, 1)
  FROM jobs_invocation i
 WHERE f.stream ~ '^[0-9]{1,18}$' AND i.id = f.stream::bigint;
UPDATE jobs_resultstream s SET attempt = GREATEST(i.attempts, 1)
  FROM jobs_invocation i
 WHERE s.stream ~ '^[0-9]{1,18}$' AND i.id = s.stream::bigint;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0013_notify_log_lines"),
    ]

    operations = [
        migrations.CreateModel(
            name="TopicWriter",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("token_id", models.BigIntegerField(unique=True)),
                ("frames", models.BigIntegerField(default=0)),
                ("bytes", models.BigIntegerField(default=0)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.RemoveConstraint(
            model_name="resultframe",
            name="frame_unique_stream_seq",
        ),
        migrations.AddField(
            model_name="resultframe",
            name="attempt",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="resultstream",
            name="attempt",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="resultstream",
            name="writer_token_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="resultstream",
            name="stream",
            field=models.CharField(max_length=200),
        ),
        migrations.RunSQL(_ADOPT_ATTEMPTS, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="resultframe",
            constraint=models.UniqueConstraint(
                fields=("stream", "attempt", "seq"), name="frame_unique_stream_attempt_seq"
            ),
        ),
        migrations.AddConstraint(
            model_name="resultstream",
            constraint=models.UniqueConstraint(
                fields=("stream", "attempt"), name="stream_unique_attempt"
            ),
        ),
    ]
