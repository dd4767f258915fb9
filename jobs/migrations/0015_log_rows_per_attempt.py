"""Issue 29: an attempt's log counts its rows (at most LAKESHORE_LOG_MAX_ROWS, half in its
head and half in its tail) and names its last row, which the next small shipment joins.
The logs stored before are counted here (their last row is left unnamed: their next
lines start a row)."""

from django.db import migrations, models

_COUNT_ROWS = """
UPDATE jobs_joblog l
   SET head_rows = c.head_rows, tail_rows = c.tail_rows
  FROM (SELECT invocation_id, attempt,
               count(*) FILTER (WHERE in_head) AS head_rows,
               count(*) FILTER (WHERE NOT in_head) AS tail_rows
          FROM jobs_logchunk GROUP BY invocation_id, attempt) c
 WHERE l.invocation_id = c.invocation_id AND l.attempt = c.attempt
"""


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0014_result_frames_per_attempt_and_topic_writers"),
    ]

    operations = [
        migrations.AddField(
            model_name="joblog",
            name="head_rows",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="joblog",
            name="last_row",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="joblog",
            name="tail_rows",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.RunSQL(_COUNT_ROWS, migrations.RunSQL.noop),
    ]
