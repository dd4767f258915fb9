"""A daemon asked to drain is woken from its long-poll at once (issue 21): its claim
then answers that it is draining, and it stops. The trigger sends `daemon:ID` on the
work channel (jobs/wakeup.py), which every claim of that daemon listens for, whichever
door set the state (scale-down, `queue rm`, an operator)."""

from django.db import migrations

SQL = """
CREATE FUNCTION lakeshore_notify_daemon_drain() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'daemon:' || NEW.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER lakeshore_daemon_drain AFTER UPDATE OF state ON queues_daemon
    FOR EACH ROW WHEN (NEW.state = 'draining' AND OLD.state IS DISTINCT FROM 'draining')
    EXECUTE FUNCTION lakeshore_notify_daemon_drain();
"""

REVERSE = """
DROP TRIGGER IF EXISTS lakeshore_daemon_drain ON queues_daemon;
DROP FUNCTION IF EXISTS lakeshore_notify_daemon_drain();
"""


class Migration(migrations.Migration):
    dependencies = [("fleet", "0001_initial")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
