"""Model instances from a raw statement's rows, the way the ORM makes them
(Model.from_db, each field's converters applied), without its per-query set-up: the
mapping of columns to fields is made once per (model, columns) and kept, since the hot
statements (claim, complete, submit; a daemon by id) run the same few column lists
again and again (tests/queues/test_rows.py compares with the ORM). With prepared=True
the statement is prepared once per pooled connection, its parameters bound by the
server (each must have one type: cast a parameter used twice); LAKESHORE_DB_PREPARED=0
turns that off for a pooler that cannot keep prepared statements. Why:
docs/decisions/0004-the-hot-statements.md."""

from django.conf import settings
from django.db import connection
from django.db.backends.postgresql.base import ServerBindingCursor

_plans: dict = {}


class _PreparedCursor(ServerBindingCursor):
    """psycopg's server-binding cursor, every statement prepared.

    Django leaves the connection's prepare_threshold at None, and psycopg then prepares
    nothing, not even when asked. It is set to 0 only while this cursor executes: with
    a threshold, psycopg would also count every other statement on the connection, and
    a client-bound statement carries its values in its text (a 10,000-item batch: some
    megabytes), which it would keep, up to 100 of them per connection. psycopg forgets
    its prepared statements at a rollback (it deallocates them); PostgreSQL keeps them
    through a rollback to a savepoint."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        conn = self.connection
        kept = conn.prepare_threshold
        conn.prepare_threshold = 0
        try:
            return super().execute(query, params, prepare=True, binary=binary)
        finally:
            conn.prepare_threshold = kept


def prepared_cursor():
    """A cursor like connection.cursor() (Django's wrapper: query logging, error
    translation) whose statements are prepared on the server."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        cursor = _PreparedCursor(connection.connection)
    if connection.queries_logged:  # DEBUG or a test capturing queries: logged like the rest
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)


def model_rows(model, sql: str, params, *, prepared: bool = False, extras=()) -> list:
    """Every row of `sql` as an instance of `model`; its columns must all be the
    model's (SELECT * or RETURNING *), but those named in `extras`, which become plain
    attributes of each instance."""
    prepared = prepared and settings.LAKESHORE_DB_PREPARED
    with prepared_cursor() if prepared else connection.cursor() as cursor:
        cursor.execute(sql, params)
        # the result's column names, not cursor.description: that builds a Column object
        # per column on every access
        result = cursor.cursor.pgresult
        if result is None or not result.nfields:
            return []
        names = tuple(result.fname(i).decode() for i in range(result.nfields))
        rows = cursor.fetchall()
    if not rows:
        return []
    added = [(i, name) for i, name in enumerate(names) if name in extras]
    if added:
        names = tuple(name if name not in extras else "" for name in names)
    attnames, order, converters = _plan(model, names)
    db = connection.alias
    made = []
    for row in rows:
        if converters:
            row = list(row)
            for position, convert, column in converters:
                value = row[position]
                for step in convert:
                    value = step(value, column, connection)
                row[position] = value
        # from_db takes the values in the model's field order, not the table's
        instance = model.from_db(db, attnames, [row[i] for i in order])
        for position, name in added:
            setattr(instance, name, row[position])
        made.append(instance)
    return made


def _plan(model, names: tuple[str, ...]):
    key = (model, names)
    plan = _plans.get(key)
    if plan is None:
        by_column = {f.column: f for f in model._meta.concrete_fields}
        unknown = [name for name in names if name and name not in by_column]
        if unknown:
            raise ValueError(f"{model.__name__} has no field for column(s) {unknown}")
        table = model._meta.db_table
        converters = []
        for position, name in enumerate(names):
            if not name:  # an extra column: not the model's
                continue
            column = by_column[name].get_col(table)
            convert = connection.ops.get_db_converters(column) + column.get_db_converters(
                connection
            )
            if convert:
                converters.append((position, convert, column))
        position = {name: i for i, name in enumerate(names)}
        fields = [f for f in model._meta.concrete_fields if f.column in position]
        plan = ([f.attname for f in fields], [position[f.column] for f in fields], converters)
        _plans[key] = plan
    return plan
