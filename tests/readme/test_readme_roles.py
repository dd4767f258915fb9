"""The README's roles table tells the truth (issue 29): every cell of the table in
"Tokens and roles" is checked against the server, one request a cell (two for "act for
a daemon", where "its own" differs from "any" only by a second daemon), through the
real application and the real PostgreSQL. Each row's first cell names its check here;
a row without a check, or a check without a row, fails. A row's cells are checked in
one world, the columns in the table's order, each acting on names of its own."""

from pathlib import Path

import msgpack
import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.services import token_create
from fleet import registration
from tests.support import builders
from tests.support.sdk_wire import ENVELOPE  # an SDK call's envelope, as its producer packs it

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["viewer", "operator", "daemon token (bootstrap)", "daemon credential", "administrator"]


def roles_table() -> dict[str, dict[str, str]]:
    """row's first cell → {column → cell}, from README "Tokens and roles"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Tokens and roles\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["what", *COLUMNS], header
    table = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        table[cells[0]] = dict(zip(COLUMNS, cells[1:], strict=True))
    return table


TABLE = roles_table()


class World:
    """Who the columns are, each with a token: vera (a viewer), mallory (an operator),
    robots' bootstrap daemon token, the credential of daemon D it registered, and
    admin (a superuser, as `bootstrap` makes it); olive (a viewer) is another user."""

    def __init__(self):
        User = get_user_model()
        builders.queue(name="w")
        User.objects.create_superuser(username="admin", email="", password=None)
        self.olive_token, _ = token_create(username="olive", role="viewer")
        made = {
            "viewer": token_create(username="vera", role="viewer"),
            "operator": token_create(username="mallory", role="operator"),
            "daemon token (bootstrap)": token_create(username="robots", role="daemon"),
            "administrator": token_create(username="admin", role="operator"),
        }
        bootstrap = made["daemon token (bootstrap)"][0]
        self.daemon, credential = registration.daemon_register(
            owner=bootstrap.user, name="d", queues=["w"], token=bootstrap
        )
        self.other_daemon, _ = registration.daemon_register(
            owner=bootstrap.user, name="e", queues=["w"], token=bootstrap
        )
        made["daemon credential"] = (self.daemon.token, credential)
        self.tokens = {column: token for column, (token, _) in made.items()}
        self.raw = {column: raw for column, (_, raw) in made.items()}


def _yes_no(response, yes=(200, 201)) -> str:
    if response.status_code in yes:
        return "yes"
    assert response.status_code == 403, (response.status_code, response.content[:300])
    return "no"


def _sdk(api: APIClient, path: str, body: dict):
    data = msgpack.packb(body, use_bin_type=True)
    return api.post(path, data=data, content_type="application/x-msgpack")


def console_pages(api, world, column, client):
    client.force_login(world.tokens[column].user)
    return _yes_no(client.get("/"))


def read_api(api, world, column, client):
    return _yes_no(api.get("/api/v1/queues/"))


def act_on_queues(api, world, column, client):
    name = f"added-{COLUMNS.index(column)}"
    return _yes_no(api.post("/api/v1/queues/", {"name": name}, format="json"))


def apply(api, world, column, client, dry_run=False):
    document = {"queues": [{"name": f"applied-{COLUMNS.index(column)}"}]}
    answer = api.post("/api/v1/apply/", {"document": document, "dry_run": dry_run}, format="json")
    return _yes_no(answer)


def apply_dry_run(api, world, column, client):
    return apply(api, world, column, client, dry_run=True)


def token_for_oneself(api, world, column, client):
    me = world.tokens[column].user.username
    return _yes_no(api.post("/api/v1/tokens/", {"user": me, "role": "viewer"}, format="json"))


def token_for_another(api, world, column, client):
    return _yes_no(api.post("/api/v1/tokens/", {"user": "olive", "role": "viewer"}, format="json"))


def grant_a_role(api, world, column, client):
    body = {"user": "olive", "role": "operator", "grant_role": True}
    return _yes_no(api.post("/api/v1/tokens/", body, format="json"))


def list_tokens(api, world, column, client):
    answer = api.get("/api/v1/tokens/", {"limit": 200})
    if _yes_no(answer) == "no":
        return "no"
    users = {row["user"] for row in answer.json()}
    return "own" if users == {world.tokens[column].user.username} else "all"


def revoke_own(api, world, column, client):
    return _yes_no(api.post(f"/api/v1/tokens/{world.tokens[column].pk}/revoke/"))


def revoke_anothers(api, world, column, client):
    return _yes_no(api.post(f"/api/v1/tokens/{world.olive_token.pk}/revoke/"))


def register_daemons(api, world, column, client):
    body = {"name": f"new-{COLUMNS.index(column)}", "queues": ["w"]}
    return _yes_no(api.post("/api/v1/daemons/register/", body, format="json"))


def act_for_a_daemon(api, world, column, client):
    beats = [
        _yes_no(api.post(f"/api/v1/daemons/{daemon.pk}/heartbeat/", {"held": []}, format="json"))
        for daemon in (world.daemon, world.other_daemon)
    ]
    return {("yes", "yes"): "any", ("yes", "no"): "its own", ("no", "no"): "no"}[tuple(beats)]


def sdk_submit(api, world, column, client):
    body = {"queue": "w", "args_blob": ENVELOPE, "run_config": {"queue": "w"}}
    return _yes_no(_sdk(api, "/v1/namespaces/default/producer/submit", body))


def sdk_poll(api, world, column, client):
    body = {"worker_id": f"new-worker-{COLUMNS.index(column)}", "queue": "w", "timeout_s": 0}
    return _yes_no(_sdk(api, "/v1/daemon/poll", body))


CHECKS = {
    "read the console's pages": console_pages,
    "read the API (queues, jobs, daemons, events)": read_api,
    "act on queues and jobs (add, pause, drain, kill, retry, submit)": act_on_queues,
    "`apply` a `lakeshore.yaml`": apply,
    "`apply` dry run": apply_dry_run,
    "make a token for oneself, of a role one holds": token_for_oneself,
    "make a token for another user": token_for_another,
    "grant a role (`grant_role` with a new token)": grant_a_role,
    "list tokens": list_tokens,
    "revoke one's own token": revoke_own,
    "revoke another user's token (a daemon's credential included)": revoke_anothers,
    "register daemons": register_daemons,
    "act for a daemon (heartbeat, claim, complete, deregister)": act_for_a_daemon,
    "SDK submit": sdk_submit,
    "SDK worker poll, as a new worker": sdk_poll,
}


def test_every_row_has_a_check_and_every_check_a_row():
    assert set(TABLE) == set(CHECKS)


def _observed(row: str, columns: list[str], client) -> dict[str, str]:
    world = World()
    observed = {}
    for column in columns:
        api = APIClient()
        api.credentials(**builders.auth(world.raw[column]))
        observed[column] = CHECKS[row](api, world, column, client)
    return observed


@pytest.mark.django_db
@pytest.mark.parametrize("row", list(TABLE))
def test_the_rows_cells_are_what_the_server_does(row, client):
    expected = {column: TABLE[row][column] for column in COLUMNS}
    assert _observed(row, list(COLUMNS), client) == expected
