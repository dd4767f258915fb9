"""A daemon that ends while its claim waits (terminated, lost, its row removed), or
whose own credential is revoked, is woken at once, as a draining one is (0002): its
claim then answers daemon_terminated, daemon_lost or token_revoked straight away. Since a parked claim waits up to fleet/parked.CLAIM_WAIT_MAX
(50 s) and a notification on its queues wakes only the few claims that waited longest
(jobs/wakeup.RELAY), the daemon's own channel is how it hears of its end."""

from django.db import migrations

SQL = """
CREATE FUNCTION lakeshore_notify_daemon_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'daemon:' || OLD.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER lakeshore_daemon_end AFTER UPDATE OF state ON queues_daemon
    FOR EACH ROW WHEN (NEW.state IN ('terminated', 'lost') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION lakeshore_notify_daemon_end();

CREATE TRIGGER lakeshore_daemon_removed AFTER DELETE ON queues_daemon
    FOR EACH ROW EXECUTE FUNCTION lakeshore_notify_daemon_end();

CREATE FUNCTION lakeshore_notify_token_revoked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'daemon:' || d.id::text)
       FROM queues_daemon d WHERE d.token_id = NEW.id;
    RETURN NULL;
END $$;

CREATE TRIGGER lakeshore_token_revoked AFTER UPDATE OF revoked_at ON accounts_apitoken
    FOR EACH ROW WHEN (NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL)
    EXECUTE FUNCTION lakeshore_notify_token_revoked();
"""

REVERSE = """
DROP TRIGGER IF EXISTS lakeshore_token_revoked ON accounts_apitoken;
DROP FUNCTION IF EXISTS lakeshore_notify_token_revoked();
DROP TRIGGER IF EXISTS lakeshore_daemon_removed ON queues_daemon;
DROP TRIGGER IF EXISTS lakeshore_daemon_end ON queues_daemon;
DROP FUNCTION IF EXISTS lakeshore_notify_daemon_end();
"""


class Migration(migrations.Migration):
    dependencies = [("fleet", "0003_beat"), ("accounts", "0001_initial")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
