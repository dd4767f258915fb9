"""Every server process hears when a token or a user changes, on the channel its
listener already LISTENs on (jobs/wakeup.py): `token:ID` when a token is revoked,
deleted, or its expiry, role, queues or user change; `user:ID` when a user is
deactivated or deleted, gains or loses staff, superuser or a group (a role), or a
group of theirs is renamed (a group's removal removes its members first). The listener drops those from its process's token cache
at once (accounts.authentication.token_cache.forget), so a daemon's own credential may
be kept there longer than any change to it would go unseen."""

from django.db import migrations

SQL = """
CREATE FUNCTION lakeshore_notify_token_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('lakeshore_work', 'token:' || OLD.id::text);
    RETURN NULL;
END $$;

CREATE TRIGGER lakeshore_token_changed AFTER UPDATE ON accounts_apitoken
    FOR EACH ROW WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at
                       OR OLD.expires_at IS DISTINCT FROM NEW.expires_at
                       OR OLD.role IS DISTINCT FROM NEW.role
                       OR OLD.queues IS DISTINCT FROM NEW.queues
                       OR OLD.bound IS DISTINCT FROM NEW.bound
                       OR OLD.user_id IS DISTINCT FROM NEW.user_id)
    EXECUTE FUNCTION lakeshore_notify_token_change();

CREATE TRIGGER lakeshore_token_deleted AFTER DELETE ON accounts_apitoken
    FOR EACH ROW EXECUTE FUNCTION lakeshore_notify_token_change();

CREATE FUNCTION lakeshore_notify_user_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'auth_group' THEN
        PERFORM pg_notify('lakeshore_work', 'user:' || m.user_id::text)
           FROM auth_user_groups m WHERE m.group_id = OLD.id;
    ELSIF TG_TABLE_NAME = 'auth_user_groups' THEN
        PERFORM pg_notify('lakeshore_work', 'user:' || COALESCE(NEW.user_id, OLD.user_id)::text);
    ELSE
        PERFORM pg_notify('lakeshore_work', 'user:' || OLD.id::text);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER lakeshore_user_changed AFTER UPDATE ON auth_user
    FOR EACH ROW WHEN (OLD.is_active IS DISTINCT FROM NEW.is_active
                       OR OLD.is_staff IS DISTINCT FROM NEW.is_staff
                       OR OLD.is_superuser IS DISTINCT FROM NEW.is_superuser)
    EXECUTE FUNCTION lakeshore_notify_user_change();

CREATE TRIGGER lakeshore_user_deleted AFTER DELETE ON auth_user
    FOR EACH ROW EXECUTE FUNCTION lakeshore_notify_user_change();

CREATE TRIGGER lakeshore_user_groups_changed AFTER INSERT OR UPDATE OR DELETE ON auth_user_groups
    FOR EACH ROW EXECUTE FUNCTION lakeshore_notify_user_change();

CREATE TRIGGER lakeshore_group_renamed AFTER UPDATE OF name ON auth_group
    FOR EACH ROW WHEN (OLD.name IS DISTINCT FROM NEW.name)
    EXECUTE FUNCTION lakeshore_notify_user_change();
"""

REVERSE = """
DROP TRIGGER IF EXISTS lakeshore_group_renamed ON auth_group;
DROP TRIGGER IF EXISTS lakeshore_user_groups_changed ON auth_user_groups;
DROP TRIGGER IF EXISTS lakeshore_user_deleted ON auth_user;
DROP TRIGGER IF EXISTS lakeshore_user_changed ON auth_user;
DROP FUNCTION IF EXISTS lakeshore_notify_user_change();
DROP TRIGGER IF EXISTS lakeshore_token_deleted ON accounts_apitoken;
DROP TRIGGER IF EXISTS lakeshore_token_changed ON accounts_apitoken;
DROP FUNCTION IF EXISTS lakeshore_notify_token_change();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0005_alter_apitoken_bound"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunSQL(SQL, REVERSE)]
