"""How a search's matches are read, newest first, at a cost that follows the matches
rather than the table.

A list ordered newest first with a LIMIT invites PostgreSQL to walk the primary key
down from the newest row and test each row against the search, stopping at the page's
last match. That is the fastest plan when matches are spread through the table, and the
slowest one when they all lie in its oldest part (a function retired a month ago): the
walk then reads every newer row first. The planner cannot tell the two apart, since its
statistics say how many rows match, not where they lie.

So a search page is read in steps. First the newest SEARCH_RECENT_ROWS rows (by id)
the plain way: a walk bounded by that many rows. If they hold some matches but too few,
their density says how much further the rest likely lie, and the walk goes on that far
(twice the guess, at most SEARCH_WALK_STRETCH times the first stretch). Only if the
walks hold too few matches are the older ones read, fenced from the primary key's order
(`Unindexed`), so that the planner collects them through the trigram index (inv_search)
and sorts them: a cost that follows how many rows match. Every read of a search also
runs under a statement timeout (LAKESHORE_SEARCH_TIMEOUT_SECONDS): a search that matches
too much to collect in that time is refused with `search_too_broad`, which says how to
narrow it."""

from contextlib import contextmanager

from django.conf import settings
from django.db import OperationalError, connection, models, transaction
from django.db.models import Max
from psycopg.errors import QueryCanceled

from jobs.models import Invocation
from lakeshore_admin.errors import DomainError

SEARCH_RECENT_ROWS = 5_000  # the newest rows a search reads by walking the ids down
SEARCH_WALK_STRETCH = 20  # how much further a walk may go, in first stretches


class SearchTooBroad(DomainError):
    """A search collected more matches than its statement timeout allows (400)."""

    status = 400
    code = "search_too_broad"


class Unindexed(models.Func):
    """A row's id as an order no index gives: sorting by it makes the planner find the
    rows first (through the index their filters suit) and sort them after."""

    template = "(%(expressions)s + 0)"
    output_field = models.BigIntegerField()

    def __init__(self):
        super().__init__(models.F("id"))


def newest(queryset, count: int, *, below: int | None = None) -> list:
    """The newest `count` rows of `queryset` (which holds a search) with an id below
    `below` (or any), newest first: the recent rows walked, the walk taken further when
    they show the matches are near, then the older ones fenced."""
    top = below if below is not None else _next_id()
    edge = top - SEARCH_RECENT_ROWS
    rows = _walk(queryset, edge, top, count)
    if rows and len(rows) < count:  # how far the rest likely lie, from how dense these are
        guess = (count - len(rows)) * SEARCH_RECENT_ROWS // len(rows)
        reach = min(2 * guess, SEARCH_WALK_STRETCH * SEARCH_RECENT_ROWS)
        rows += _walk(queryset, edge - reach, edge, count - len(rows))
        edge -= reach
    if len(rows) < count:  # their ids collected and sorted (narrow), then their rows
        older = queryset.filter(id__lt=edge).order_by(Unindexed().desc())
        ids = list(older.values_list("id", flat=True)[: count - len(rows)])
        rows += list(queryset.filter(id__in=ids).order_by("-id")) if ids else []
    return rows


def _walk(queryset, low: int, high: int, count: int) -> list:
    """Up to `count` rows with ids in [low, high), newest first (a walk down the ids)."""
    return list(queryset.filter(id__gte=low, id__lt=high).order_by("-id")[:count])


def oldest_id(queryset) -> int | None:
    """The lowest id among `queryset`'s rows (which hold a search), found fenced: where
    a bulk action over a search starts its walk up the ids."""
    found = queryset.order_by(Unindexed()).values_list("id", flat=True)[:1]
    return next(iter(found), None)


def _next_id() -> int:
    """One above the newest row's id (the primary key's last entry)."""
    return (Invocation.objects.aggregate(newest=Max("id"))["newest"] or 0) + 1


@contextmanager
def bounded(text: str):
    """Run a search's reads under LAKESHORE_SEARCH_TIMEOUT_SECONDS, then put the
    transaction's own timeout back; past it, refuse the search with search_too_broad
    (the reads roll back to where they began). No text: nothing to bound."""
    if not text:
        yield
        return
    seconds = settings.LAKESHORE_SEARCH_TIMEOUT_SECONDS
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'),"
                " set_config('statement_timeout', %s, true)",
                [f"{seconds * 1000:.0f}"],
            )
            ((before, _),) = cursor.fetchall()
            yield
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [before])
    except OperationalError as error:
        if not isinstance(error.__cause__, QueryCanceled):
            raise
        raise SearchTooBroad(
            f"The search {text!r} matches too many jobs to read within {seconds:g} s: "
            "narrow it with a queue, a state or a time (since, until), or a longer text.",
            fields={"search": "matches too many jobs; narrow it"},
        ) from error
