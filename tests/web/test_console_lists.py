"""The console's one list (lakeshore_admin/lists.py), checked on each of its five lists:
keyset paging both ways that keeps the filters, page numbers only for a small list, a
broken key that shows the first page, the FilterSet's own form with its errors, and the
same queries on every page whatever the rows. Then the tokens page: who sees what, no
secret, and Revoke."""

import html
import re
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import ApiToken, AuditEvent
from accounts.roles import grant
from accounts.services import token_create
from accounts.views import EventListPage, TokenListPage
from fleet.views import DaemonListPage
from jobs.models import Invocation
from jobs.views import JobListPage
from queues.models import Queue, QueueEvent
from queues.services import queue_transition
from queues.views import QueueListPage
from tests.support import builders

pytestmark = pytest.mark.django_db

ROW = re.compile(r"keep[-. ]\d{3}")


def _queues(n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        builders.queue(name=f"keep-{i:03d}")
        queue_transition(name=f"keep-{i:03d}", action="pause")
    if not start:
        builders.queue(name="other-active")  # not paused: the filter leaves it out


def _jobs(n: int, start: int = 0) -> None:
    Invocation.objects.bulk_create(
        [Invocation(function=f"keep.{i:03d}") for i in range(start, start + n)]
    )
    Invocation.objects.create(function="other.x")


def _daemons(n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        builders.daemon(name=f"keep-{i:03d}", queues=["keep"])
    builders.daemon(name=f"other-{start}", queues=["other"])


def _events(n: int, start: int = 0) -> None:
    if not start:
        builders.queue(name="keep-q0")
        builders.queue(name="other-q0")
        AuditEvent.objects.filter(queue__in=["keep-q0", "other-q0"]).delete()  # decisions only
    keep, other = Queue.objects.get(name="keep-q0"), Queue.objects.get(name="other-q0")
    at = timezone.now()
    for i in range(start, start + n):
        QueueEvent.objects.create(
            queue=keep, at=at - timedelta(seconds=i), action="scale_up", reason=f"keep {i:03d}",
            daemons=1, busy=1, pending=3, utilization=1.0, desired=2, delta=1,
        )  # fmt: skip
    QueueEvent.objects.create(
        queue=other, at=at, action="scale_up", reason="other", daemons=1, busy=1, pending=3,
        utilization=1.0, desired=2, delta=1,
    )  # fmt: skip


def _tokens(n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        token_create(username="keep-user", role="viewer", name=f"keep {i:03d}")
    token_create(username=f"other-user-{start}", role="viewer", name="other")


@dataclass
class Case:
    view: type
    url: str  # with the filter that keeps the keep-rows and leaves the others out
    make: object
    bad_filter: str  # a value the FilterSet refuses, and the field it names
    role: str = "viewer"

    def __str__(self) -> str:
        return self.view.__name__


CASES = [
    Case(QueueListPage, "/?state=paused", _queues, "state=nope"),
    Case(JobListPage, "/jobs/?function=keep.", _jobs, "id=abc"),
    Case(DaemonListPage, "/daemons/?queue=keep", _daemons, "state=nope"),
    Case(EventListPage, "/events/?queue=keep-q0", _events, "action=nope"),
    Case(TokenListPage, "/tokens/?user=keep-user", _tokens, "role=nope", role="admin"),
]


def _login(client, role: str, name: str | None = None):
    """Log in as `name` (made if need be) holding `role`; "admin" is a superuser."""
    user, _ = get_user_model().objects.get_or_create(username=name or f"{role}-u")
    if role == "admin":
        user.is_superuser = user.is_staff = True
        user.save()
    else:
        grant(user, role)
    client.force_login(user)
    return client


def _get(client, url: str) -> str:
    response = client.get(html.unescape(url))
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def _table(body: str) -> str:
    return body.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in body else ""


def _rows(body: str) -> list[str]:
    return list(dict.fromkeys(ROW.findall(_table(body))))


def _rel(body: str, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)"[^>]*rel="{rel}"', body)
    return html.unescape(found.group(1)) if found else None


def _pages(body: str) -> dict[int, tuple[str, bool]]:
    """The pager's numbers: {n: (url, current)}."""
    found = re.findall(r'<a href="([^"]+)"[^>]*aria-label="Page (\d+)"([^>]*)>', body)
    return {int(n): (html.unescape(url), "aria-current" in rest) for url, n, rest in found}


@pytest.fixture
def small(monkeypatch):
    """Pages of 2 rows; page numbers up to 10 pages."""

    def shrink(case: Case):
        monkeypatch.setattr(case.view, "page_size", 2)
        monkeypatch.setattr(case.view, "max_pages", 10)

    return shrink


@pytest.mark.parametrize("case", CASES, ids=str)
def test_it_pages_forward_and_back_by_key_and_keeps_the_filter(client, case, small):
    small(case)
    case.make(7)
    user = _login(client, case.role)
    filter_param = case.url.split("?", 1)[1]
    body = _get(user, case.url)
    assert _rel(body, "prev") is None
    seen, pages = [], [body]
    while True:
        rows = _rows(body)
        assert len(rows) == (2 if len(seen) < 6 else 1), rows
        seen += rows
        following = _rel(body, "next")
        if following is None:
            break
        assert filter_param in following and "after=" in following
        body = _get(user, following)
        pages.append(body)
    assert len(set(seen)) == len(seen) == 7  # no gap, no repeat
    assert not any("other" in _table(page) for page in pages)  # the filter held
    for back in range(len(pages) - 1, 0, -1):  # and back, page by page
        previous = _rel(body, "prev")
        assert filter_param in previous and "before=" in previous
        body = _get(user, previous)
        assert _rows(body) == _rows(pages[back - 1])
    assert _rel(body, "prev") is None  # the first page again


@pytest.mark.parametrize("case", CASES, ids=str)
def test_page_numbers_show_for_a_small_list_only(client, case, small, monkeypatch):
    small(case)
    case.make(7)  # 4 pages of 2
    user = _login(client, case.role)
    numbers = _pages(_get(user, case.url))
    assert sorted(numbers) == [1, 2, 3, 4] and numbers[1][1] and not numbers[3][1]
    third = _pages(_get(user, numbers[3][0]))
    assert third[3][1] and not third[1][1]  # aria-current moves to page 3
    monkeypatch.setattr(case.view, "max_pages", 3)  # now the same list is too long
    body = _get(user, case.url)
    assert _pages(body) == {} and _rel(body, "next")


def test_a_big_jobs_table_is_never_counted(client, monkeypatch):
    monkeypatch.setattr(JobListPage, "page_size", 2)
    monkeypatch.setattr(JobListPage, "max_pages", 3)
    _jobs(10)
    user = _login(client, "viewer")
    with CaptureQueriesContext(connection) as ctx:
        body = _get(user, "/jobs/")
    on_jobs = [q["sql"] for q in ctx.captured_queries if 'FROM "jobs_invocation"' in q["sql"]]
    assert on_jobs and not any("COUNT(" in sql for sql in on_jobs)
    assert any(sql.endswith("LIMIT 7") for sql in on_jobs)  # the keys: 3 pages of 2, and one
    assert _pages(body) == {}


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("key", ["after=%00", "before=%00", f"after={'x' * 300}"])
def test_a_broken_key_shows_the_first_page_and_says_so(client, case, small, key):
    small(case)
    case.make(3)
    user = _login(client, case.role)
    first = _rows(_get(user, case.url))
    body = _get(user, f"{case.url}&{key}")
    assert _rows(body) == first
    assert 'role="alert"' in body and "broken" in body


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_huge_key_is_no_error(client, case, small):
    small(case)
    case.make(3)
    user = _login(client, case.role)
    for key in ("after=" + "9" * 30, "before=" + "9" * 30, "after=-1"):
        _get(user, f"{case.url}&{key}")  # 200, whatever it shows


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_filter_form_is_the_filtersets_and_shows_a_bad_value(client, case):
    user = _login(client, case.role)
    body = _get(user, case.url)
    form = body.split('<form class="filters"', 1)[1].split("</form>", 1)[0]
    view = case.view
    shown = view.shown_filters or list(view.filterset_class.base_filters)
    names = list(dict.fromkeys(re.findall(r'name="(\w+)"', form)))
    assert names == list(shown)  # the FilterSet's fields, in the list's order
    assert f'hx-target="#{view.table_id}"' in form
    field = case.bad_filter.split("=")[0]
    bad = _get(user, f"{case.url}&{case.bad_filter}")
    assert 'role="alert"' in bad and f"{field}: " in bad
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', bad) or field not in shown


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_page_costs_the_same_queries_for_1_and_many_rows(client, case, monkeypatch):
    monkeypatch.setattr(case.view, "page_size", 5)
    user = _login(client, case.role)

    def count(url: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            _get(user, url)
        return len(ctx)

    case.make(1)
    one = count(case.url)
    case.make(11, start=1)
    assert count(case.url) == one  # a first page of 5, with page numbers
    second = _pages(_get(user, case.url))[2][0]
    assert count(second) == one


def test_an_htmx_request_gets_the_table_of_any_list(client):
    user = _login(client, "viewer")
    pages = ((JobListPage, "/jobs/"), (DaemonListPage, "/daemons/"), (EventListPage, "/events/"))
    for view, url in pages:
        headers = {"HX-Request": "true", "HX-Target": view.table_id}
        body = user.get(url, headers=headers).content.decode()
        assert body.lstrip().startswith(f'<div id="{view.table_id}"') and "<html" not in body


# ---------------------------------------------------------------------------- tokens


@pytest.fixture
def tokens():
    mine, _ = token_create(username="olga", role="operator", name="olga's ci")
    theirs, raw = token_create(username="bob", role="viewer", name="bob's laptop")
    return {"mine": mine, "theirs": theirs, "raw": raw}


def test_an_admin_sees_every_token(client, tokens):
    body = _get(_login(client, "admin"), "/tokens/")
    assert "olga&#x27;s ci" in body and "bob&#x27;s laptop" in body
    assert "Every API token" in body


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_anyone_else_sees_their_own_tokens_only(client, tokens, role):
    user = _login(client, role, name="olga")
    body = _get(user, "/tokens/")
    assert "olga&#x27;s ci" in body and "bob&#x27;s laptop" not in body
    assert "Your API tokens" in body


def test_no_secret_is_on_the_page(client, tokens):
    body = _get(_login(client, "admin"), "/tokens/")
    raw, theirs = tokens["raw"], tokens["theirs"]
    assert raw not in body and raw[len(theirs.prefix) :] not in body
    assert theirs.digest not in body
    assert f'<code class="nowrap">{theirs.prefix}…</code>' in body  # known by its first characters


def test_an_operator_revokes_a_token_with_the_apis_service(client, tokens):
    user = _login(client, "operator", name="olga")
    mine = tokens["mine"]
    body = user.post(f"/tokens/{mine.pk}/revoke/", follow=True).content.decode()
    assert f"Token {mine.prefix}… (olga&#x27;s ci) revoked." in body
    assert ApiToken.objects.get(pk=mine.pk).revoked_at is not None
    last = AuditEvent.objects.order_by("-id").first()
    assert (last.action, last.actor, last.via) == ("token.revoke", "olga", "console")
    assert f'id="revoke-{mine.pk}"' not in body  # no button for a revoked token
    again = user.post(f"/tokens/{mine.pk}/revoke/", follow=True).content.decode()
    assert "was already revoked" in again


def test_a_revoke_from_htmx_goes_back_to_the_page_it_came_from(client, tokens):
    user = _login(client, "admin")
    headers = {"HX-Request": "true", "HX-Current-URL": "http://testserver/tokens/?role=viewer"}
    response = user.post(f"/tokens/{tokens['theirs'].pk}/revoke/", headers=headers)
    assert response.status_code == 204 and response["HX-Redirect"] == "/tokens/?role=viewer"


def test_a_viewer_may_not_revoke_even_its_own_token(client, tokens):
    viewer = _login(client, "viewer", name="bob")
    theirs = tokens["theirs"]
    page = _get(viewer, "/tokens/")
    assert "bob&#x27;s laptop" in page and "Revoke</button>" not in page
    assert viewer.post(f"/tokens/{theirs.pk}/revoke/").status_code == 403
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None
    # the negative control: the same request from an admin revokes it
    admin = _login(client, "admin")
    assert admin.post(f"/tokens/{theirs.pk}/revoke/").status_code == 302
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is not None


def test_an_operator_may_not_revoke_a_token_it_cannot_see(client, tokens):
    user = _login(client, "operator", name="olga")
    assert user.post(f"/tokens/{tokens['theirs'].pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=tokens["theirs"].pk).revoked_at is None


def test_the_nav_links_the_tokens_page(client):
    assert 'href="/tokens/">Tokens</a>' in _get(_login(client, "viewer"), "/")
