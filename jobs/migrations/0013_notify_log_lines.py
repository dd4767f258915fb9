"""A log's follow (`lakeshore jobs logs --follow`, GET …/logs/?follow=1) waits on the
listening connection (jobs/wakeup.py) for its next line: `log:ID` when an invocation's
log gains lines (a daemon's ship), so a waiting follow wakes at once. One notification
per log a ship statement touches; NOTIFY is sent at commit, and repeats in one
transaction are sent once."""

from django.db import migrations

SQL = """
CREATE FUNCTION lakeshore_notify_log_lines() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'log:' || NEW.invocation_id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER joblog_started AFTER INSERT ON jobs_joblog
    FOR EACH ROW WHEN (NEW.lines > 0)
    EXECUTE FUNCTION lakeshore_notify_log_lines();

CREATE TRIGGER joblog_lines AFTER UPDATE OF lines ON jobs_joblog
    FOR EACH ROW WHEN (NEW.lines > OLD.lines)
    EXECUTE FUNCTION lakeshore_notify_log_lines();
"""

REVERSE = """
DROP TRIGGER IF EXISTS joblog_lines ON jobs_joblog;
DROP TRIGGER IF EXISTS joblog_started ON jobs_joblog;
DROP FUNCTION IF EXISTS lakeshore_notify_log_lines();
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0012_notify_sdk_results")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
