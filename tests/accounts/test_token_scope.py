"""A token does what its role and its queues say, never more (issue 17, findings 3
and 4). Each attack is refused; each negative control puts back the rule before
(roles read from the user, any queue for any daemon token) and shows it succeed."""

import msgpack
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounts import roles
from accounts.models import ApiToken
from accounts.services import token_create
from fleet.models import Daemon
from jobs import services
from queues.models import Queue
from tests.support import builders
from tests.support.sdk_wire import answer_of

pytestmark = [pytest.mark.django_db, pytest.mark.security]


def _as(api, raw):
    api.credentials(**builders.auth(raw))
    return api


def _poll(api, raw, queue):
    body = msgpack.packb({"worker_id": "h-1", "queue": queue, "timeout_s": 0}, use_bin_type=True)
    answer = api.post(
        "/v1/daemon/poll",
        data=body,
        content_type="application/x-msgpack",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    return answer.status_code, answer_of(answer)


# ---------------------------------------------------------------------------- roles


def test_a_viewer_token_of_an_operator_reads_and_never_writes(api):
    token_create(username="alice", role="operator")
    _, viewer = token_create(username="alice", role="viewer")
    builders.queue(name="train")
    _as(api, viewer)
    assert api.get("/api/v1/queues/").status_code == 200
    writes = [
        api.post("/api/v1/queues/", {"name": "new"}, format="json"),
        api.post("/api/v1/queues/train/pause/", format="json"),
        api.delete("/api/v1/queues/train/"),
        api.post("/api/v1/jobs/", {"function": "lakeshore.functions.echo"}, format="json"),
        api.post("/api/v1/jobs/bulk-cancel/", {}, format="json"),
    ]
    assert [w.status_code for w in writes] == [403] * len(writes)
    assert list(Queue.objects.values_list("name", "state")) == [("train", "active")]


def test_negative_control_with_roles_read_from_the_user_the_viewer_token_writes(api, monkeypatch):
    token_create(username="alice", role="operator")
    _, viewer = token_create(username="alice", role="viewer")
    monkeypatch.setattr(
        "accounts.authentication.bind_token", lambda user, token: roles.roles_of(user)
    )
    _as(api, viewer)
    assert api.post("/api/v1/queues/", {"name": "new"}, format="json").status_code == 201


def test_a_token_loses_what_its_user_loses(api):
    token, raw = token_create(username="bob", role="operator")
    token.user.groups.clear()
    _as(api, raw)
    assert api.get("/api/v1/queues/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_tokens_their_users_role():
    executor = MigrationExecutor(connection)
    before = [
        ("accounts", "0003_audit_target_index"),
        ("queues", "0010_daemon_current_invocation_derived"),
    ]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    User, Group = old.get_model("auth", "User"), old.get_model("auth", "Group")
    Token = old.get_model("accounts", "ApiToken")
    made = {}
    for name, group, staff in [("ops", "operator", False), ("root", None, True),
                               ("robot", "daemon", False), ("eye", "viewer", False)]:  # fmt: skip
        user = User.objects.create(username=name, is_staff=staff)
        if group:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
        made[name] = Token.objects.create(user=user, prefix=name, digest=name * 8).pk
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    roles_now = dict(ApiToken.objects.filter(pk__in=made.values()).values_list("prefix", "role"))
    assert roles_now == {"ops": "operator", "root": "operator", "robot": "daemon", "eye": "viewer"}


# ---------------------------------------------------------------------------- queues


@pytest.fixture
def scoped():
    for name in ("a", "b", "secret"):
        builders.queue(name=name)
    _, raw = token_create(username="robot", role="daemon", queues=["a", "b"])
    return raw


def test_a_scoped_daemon_token_registers_only_on_its_queues(api, scoped):
    _as(api, scoped)
    ok = api.post("/api/v1/daemons/register/", {"name": "d", "queues": ["a", "b"]}, format="json")
    assert ok.status_code == 201
    for queues in (["secret"], ["a", "secret"], []):
        refused = api.post(
            "/api/v1/daemons/register/", {"name": "x", "queues": queues}, format="json"
        )
        assert (refused.status_code, refused.json()["error"]["code"]) == (
            403,
            "queue_not_in_scope",
        ), queues
    assert Daemon.objects.count() == 1


def test_a_scoped_token_never_claims_another_queues_work_through_the_sdk(api, scoped):
    services.invocation_submit(function="lakeshore.functions.echo", queue="secret")
    status, refused = _poll(api, scoped, "secret")
    assert (status, refused["error"]["code"]) == (403, "queue_not_in_scope")
    assert not Daemon.objects.exists()
    assert _poll(api, scoped, "a") == (200, {"commands": []})


def test_negative_control_without_the_scope_the_token_takes_the_secret_queue(
    api, scoped, monkeypatch
):
    monkeypatch.setattr(ApiToken, "allows_queues", lambda self, names: True)
    _as(api, scoped)
    made = api.post("/api/v1/daemons/register/", {"name": "x", "queues": ["secret"]}, format="json")
    assert made.status_code == 201


def test_a_provider_daemons_credential_serves_only_its_own_queue(api, settings):
    builders.provider(name="here", kind="simulated")
    builders.queue(name="w")
    builders.queue(name="secret")
    daemon = builders.daemon(queues=["w"], state="lost")
    _, raw = builders.credential(daemon, username="provider-here")
    _as(api, raw)
    refused = api.post(
        "/api/v1/daemons/register/", {"name": "again", "queues": ["secret"]}, format="json"
    )
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "queue_not_in_scope")
    again = api.post("/api/v1/daemons/register/", {"name": "again", "queues": ["w"]}, format="json")
    assert again.status_code == 201 and again.json()["token"] is None  # it keeps its own


def test_create_token_scopes_a_daemon_token(capsys):
    call_command("create_token", user="robot", role="daemon", queues="a,b")
    raw = capsys.readouterr().out.strip()
    token = ApiToken.objects.get(prefix=raw[:12])
    assert (token.role, token.queues) == ("daemon", ["a", "b"])
    with pytest.raises(CommandError, match="Only daemon tokens are scoped to queues"):
        call_command("create_token", user="alice", role="operator", queues="a")


def test_operators_make_scoped_tokens_through_the_api_and_nobody_else_does(api):
    _as(api, builders.token("operator", username="robots"))  # their own (issue 29, item 7)
    made = api.post(
        "/api/v1/tokens/",
        {"user": "robots", "role": "daemon", "queues": ["a"], "name": "gpu pool"},
        format="json",
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert (body["role"], body["queues"], body["user"]) == ("daemon", ["a"], "robots")
    assert body["token"].startswith("lsk_")
    listed = api.get("/api/v1/tokens/", {"limit": 1})
    assert "token" not in listed.json()[0] and 'rel="next"' in listed["Link"]
    refused = api.post(
        "/api/v1/tokens/", {"user": "robots", "role": "viewer", "queues": ["a"]}, format="json"
    )
    assert refused.status_code == 400
    revoked = api.post(f"/api/v1/tokens/{body['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    for role in ("viewer", "daemon"):
        _as(api, builders.token(role))
        assert api.post("/api/v1/tokens/", {"user": "me", "role": "operator"},
                        format="json").status_code == 403  # fmt: skip
        assert api.get("/api/v1/tokens/").status_code == 403
