"""The SDK's await and result stream wait on the listening connection (jobs/wakeup.py)
rather than look again and again: `inv:ID` when an SDK invocation (its wire is the
SDK's) ends, `frame:STREAM` when a result frame is written. A waiting await or stream
wakes at once; its looks between are only a safety net. Invocations of the REST API and
the CLI (wire "") notify nothing here: nothing awaits them this way, and a bulk-cancel
of many of them stays one statement's work. NOTIFY is sent at commit."""

from django.db import migrations

SQL = """
CREATE FUNCTION lakeshore_notify_sdk_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'inv:' || NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER invocation_sdk_ended AFTER UPDATE OF state ON jobs_invocation
    FOR EACH ROW WHEN (NEW.wire <> ''
                       AND NEW.state IN ('succeeded', 'failed', 'killed', 'timeout')
                       AND OLD.state NOT IN ('succeeded', 'failed', 'killed', 'timeout'))
    EXECUTE FUNCTION lakeshore_notify_sdk_end();

CREATE FUNCTION lakeshore_notify_frame() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'frame:' || NEW.stream);
    RETURN NULL;
END $$;

CREATE TRIGGER resultframe_written AFTER INSERT ON jobs_resultframe
    FOR EACH ROW EXECUTE FUNCTION lakeshore_notify_frame();
"""

REVERSE = """
DROP TRIGGER IF EXISTS resultframe_written ON jobs_resultframe;
DROP FUNCTION IF EXISTS lakeshore_notify_frame();
DROP TRIGGER IF EXISTS invocation_sdk_ended ON jobs_invocation;
DROP FUNCTION IF EXISTS lakeshore_notify_sdk_end();
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0011_bulk_cancel_writes_fewer_indexes")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
