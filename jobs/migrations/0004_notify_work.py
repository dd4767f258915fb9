"""Waiting claims sleep on PostgreSQL LISTEN/NOTIFY instead of polling: whenever an
invocation becomes queued (submit, requeue, retry) its queue's name is sent on the
channel `lakeshore_work`, and when a queue starts dispatching again (resume, unpause,
unarchive) so is its name. A retry that waits for its back-off sends `name@epoch`, the
time it becomes claimable. Triggers, so that every path — the API, admin, the SDK's
routes, raw SQL — wakes the daemons, and nothing has to remember to. NOTIFY is sent
at commit, so a waiting daemon never wakes for work it cannot see yet."""

from django.db import migrations

FORWARD = """
CREATE FUNCTION lakeshore_notify_invocation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.scheduled_at IS NOT NULL AND NEW.scheduled_at > now() THEN
        PERFORM pg_notify('lakeshore_work',
                          NEW.queue || '@' || extract(epoch FROM NEW.scheduled_at)::text);
    ELSE
        PERFORM pg_notify('lakeshore_work', NEW.queue);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER invocation_queued_insert AFTER INSERT ON jobs_invocation
    FOR EACH ROW WHEN (NEW.state = 'queued')
    EXECUTE FUNCTION lakeshore_notify_invocation();

CREATE TRIGGER invocation_queued_update AFTER UPDATE OF state ON jobs_invocation
    FOR EACH ROW WHEN (NEW.state = 'queued' AND OLD.state <> 'queued')
    EXECUTE FUNCTION lakeshore_notify_invocation();

CREATE FUNCTION lakeshore_notify_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', NEW.name);
    RETURN NULL;
END $$;

CREATE TRIGGER queue_dispatching AFTER UPDATE OF state ON queues_queue
    FOR EACH ROW WHEN (NEW.state IN ('active', 'draining')
                       AND OLD.state NOT IN ('active', 'draining'))
    EXECUTE FUNCTION lakeshore_notify_queue();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS queue_dispatching ON queues_queue;
DROP FUNCTION IF EXISTS lakeshore_notify_queue();
DROP TRIGGER IF EXISTS invocation_queued_update ON jobs_invocation;
DROP TRIGGER IF EXISTS invocation_queued_insert ON jobs_invocation;
DROP FUNCTION IF EXISTS lakeshore_notify_invocation();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0003_retry_backoff_and_running_index"),
        ("queues", "0003_daemon_token"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
