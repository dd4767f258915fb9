"""Tokens for anyone (issue 29, item 7): an operator makes, lists and revokes only
their own tokens, never of a role above their own; only an administrator (active staff
with the token model's view, add and change permissions) acts for other users, and a
role is granted only by an administrator who asks, never as a token's side effect.

Each attack goes through the API and is refused with its code, and nothing changes;
the controls show an operator's own tokens still work, an administrator acting for
others, the audit naming who really acted, and (the rule switched off) the same attack
succeeding. tests/accounts/test_principals_server.py repeats one through make run's
server."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command

from accounts import services
from accounts.models import ApiToken, AuditEvent
from accounts.roles import grant, user_roles
from accounts.services import token_create, token_mint
from lakeshore_admin.errors import Forbidden
from tests.support import builders

pytestmark = [pytest.mark.django_db, pytest.mark.security]

TOKENS = "/api/v1/tokens/"


@pytest.fixture
def people():
    """admin (a superuser, as `bootstrap` makes it), mallory (an operator), vera (a
    viewer) and a daemon credential of a provider's user: each with a token."""
    User = get_user_model()
    User.objects.create_superuser(username="admin", email="", password="x")  # noqa: S106
    _, admin = token_create(username="admin", role="operator", name="admin's")
    _, mallory = token_create(username="mallory", role="operator", name="mallory's")
    vera_token, vera = token_create(username="vera", role="viewer", name="vera's")
    daemon = builders.daemon(queues=[], name="d-1")
    credential, _ = builders.credential(daemon, username="provider-here")
    return {
        "admin": admin,
        "mallory": mallory,
        "vera": vera,
        "vera_token": vera_token,
        "credential": credential,
    }


def _as(api, raw):
    api.credentials(**builders.auth(raw))
    return api


def _code(response) -> tuple[int, str]:
    return response.status_code, response.json().get("error", {}).get("code", "")


def test_an_operator_cannot_mint_a_token_for_another_user(api, people):
    _as(api, people["mallory"])
    before = ApiToken.objects.count()
    for user, role in [("admin", "operator"), ("vera", "operator"), ("vera", "viewer")]:
        answer = api.post(TOKENS, {"user": user, "role": role}, format="json")
        assert _code(answer) == (403, "not_your_token"), (user, role)
    assert ApiToken.objects.count() == before
    assert user_roles(get_user_model().objects.get(username="vera")) == {"viewer"}


def test_control_an_operator_mints_its_own_tokens_and_they_act_as_it(api, people):
    _as(api, people["mallory"])
    made = {}
    for role in ("daemon", "viewer", "operator"):
        answer = api.post(TOKENS, {"user": "mallory", "role": role}, format="json")
        assert (answer.status_code, answer.json()["user"]) == (201, "mallory"), answer.json()
        made[role] = answer.json()["token"]
    _as(api, made["operator"])
    assert api.post("/api/v1/queues/", {"name": "mine"}, format="json").status_code == 201
    created = AuditEvent.objects.get(action="queue.create")
    assert created.actor == "mallory"  # the audit names who acted


def test_control_with_the_rule_switched_off_an_operator_mints_for_admin(api, people, monkeypatch):
    """What the server did before: any operator made `admin`'s token, and a queue made
    with it was audited as `admin`'s."""
    monkeypatch.setattr(services, "is_token_admin", lambda user: True)
    _as(api, people["mallory"])
    made = api.post(TOKENS, {"user": "admin", "role": "operator"}, format="json")
    assert made.status_code == 201
    _as(api, made.json()["token"])
    assert api.post("/api/v1/queues/", {"name": "framed"}, format="json").status_code == 201
    assert AuditEvent.objects.get(action="queue.create").actor == "admin"


def test_a_token_never_grants_a_role(api, people):
    """Even an administrator's token for vera of a role she lacks is refused unless
    the administrator asks to grant it; asked, the grant is audited as the admin's."""
    _as(api, people["admin"])
    refused = api.post(TOKENS, {"user": "vera", "role": "operator"}, format="json")
    assert _code(refused) == (409, "role_not_held")
    assert user_roles(get_user_model().objects.get(username="vera")) == {"viewer"}
    viewer = api.post(TOKENS, {"user": "vera", "role": "viewer"}, format="json")
    assert (viewer.status_code, viewer.json()["user"]) == (201, "vera")  # a role she holds
    granted = api.post(
        TOKENS, {"user": "vera", "role": "operator", "grant_role": True}, format="json"
    )
    assert granted.status_code == 201
    assert "operator" in user_roles(get_user_model().objects.get(username="vera"))
    grant_event = AuditEvent.objects.get(action="role.grant")
    assert (grant_event.actor, grant_event.target, grant_event.summary) == (
        "admin",
        "user vera",
        "granted operator",
    )
    made_event = AuditEvent.objects.filter(action="token.create").latest("id")
    assert (made_event.actor, made_event.summary) == ("admin", "operator token for vera")


def test_an_operator_cannot_grant_by_asking(api, people):
    _as(api, people["mallory"])
    answer = api.post(
        TOKENS, {"user": "vera", "role": "operator", "grant_role": True}, format="json"
    )
    assert _code(answer) == (403, "not_your_token")
    assert user_roles(get_user_model().objects.get(username="vera")) == {"viewer"}


def test_no_token_of_a_role_above_its_makers(people):
    """The rule in accounts/services.py itself: the API's Operate lets no viewer reach
    it, but the rule does not lean on that."""
    vera = get_user_model().objects.get(username="vera")
    with pytest.raises(Forbidden) as refused:
        token_mint(actor=vera, username="vera", role="operator")
    assert refused.value.code == "role_above_yours"
    token, _ = token_mint(actor=vera, username="vera", role="viewer")
    assert token.role == "viewer"


def test_an_operator_lists_only_its_own_tokens(api, people):
    _as(api, people["mallory"])
    listed = api.get(TOKENS, {"limit": 200})
    assert {row["user"] for row in listed.json()} == {"mallory"}
    _as(api, people["admin"])  # control: an administrator lists everyone's
    everyone = {row["user"] for row in api.get(TOKENS, {"limit": 200}).json()}
    assert everyone == {"admin", "mallory", "vera", "provider-here"}


def test_an_operator_cannot_revoke_anothers_token(api, people):
    _as(api, people["mallory"])
    for victim in (people["credential"], people["vera_token"]):
        answer = api.post(f"{TOKENS}{victim.pk}/revoke/")
        assert _code(answer) == (403, "not_your_token")
        victim.refresh_from_db()
        assert victim.revoked_at is None
    own = ApiToken.objects.filter(user__username="mallory").get()
    assert api.post(f"{TOKENS}{own.pk}/revoke/").status_code == 200  # control: its own


def test_control_an_administrator_revokes_anyones_and_the_audit_says_so(api, people):
    _as(api, people["admin"])
    answer = api.post(f"{TOKENS}{people['credential'].pk}/revoke/")
    assert answer.status_code == 200 and answer.json()["revoked_at"]
    event = AuditEvent.objects.get(action="token.revoke")
    assert event.actor == "admin"


def test_staff_without_the_token_permissions_act_only_for_themselves(api, people):
    """Staff act as operators, but an administrator of tokens also holds the token
    model's view, add and change permissions; given them, the same user acts for all."""
    User = get_user_model()
    sam = User.objects.create_user(username="sam", password="x", is_staff=True)  # noqa: S106
    _, raw = token_create(username="sam", role="operator")
    _as(api, raw)
    assert _code(api.post(TOKENS, {"user": "vera", "role": "viewer"}, format="json")) == (
        403,
        "not_your_token",
    )
    assert {row["user"] for row in api.get(TOKENS).json()} == {"sam"}
    sam.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="accounts",
            codename__in=["view_apitoken", "add_apitoken", "change_apitoken"],
        )
    )
    as_administrator = api.post(TOKENS, {"user": "vera", "role": "viewer"}, format="json")
    assert as_administrator.status_code == 201


def test_the_consoles_revoke_keeps_the_same_rule(client, people):
    User = get_user_model()
    olga = User.objects.create_user(username="olga", password="x")  # noqa: S106
    grant(olga, "operator")
    client.force_login(olga)
    answer = client.post(f"/tokens/{people['vera_token'].pk}/revoke/")
    assert answer.status_code == 404
    people["vera_token"].refresh_from_db()
    assert people["vera_token"].revoked_at is None


def test_the_server_owners_command_still_grants(capsys):
    """`manage.py create_token` is the server owner's tool: it may grant a role."""
    call_command("create_token", user="newcomer", role="operator")
    raw = capsys.readouterr().out.strip()
    token = ApiToken.objects.get(prefix=raw[:12])
    assert token.user.username == "newcomer"
    assert "operator" in user_roles(token.user)


def test_django_admin_lists_and_revokes_by_the_same_rule(client, people):
    """Staff with the token model's view and change permissions but not add: Django
    admin shows them their own tokens only (Django alone showed every one)."""
    User = get_user_model()
    sam = User.objects.create_user(username="sam", password="x", is_staff=True)  # noqa: S106
    sam.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="accounts", codename__in=["view_apitoken", "change_apitoken"]
        )
    )
    own, _ = token_create(username="sam", role="operator", name="sam's")
    client.force_login(sam)
    listed = client.get("/admin/accounts/apitoken/")
    assert listed.status_code == 200
    shown = {t.pk for t in listed.context["cl"].result_list}
    assert shown == {own.pk}
    victim = people["vera_token"]
    answer = client.post(
        "/admin/accounts/apitoken/",
        {"action": "revoke", "_selected_action": [victim.pk, own.pk]},
    )
    assert answer.status_code == 302
    victim.refresh_from_db()
    own.refresh_from_db()
    assert victim.revoked_at is None and own.revoked_at is not None
    # control: given add too, sam is an administrator, and sees everyone's tokens
    sam.user_permissions.add(
        Permission.objects.get(content_type__app_label="accounts", codename="add_apitoken")
    )
    client.force_login(User.objects.get(pk=sam.pk))
    listed = client.get("/admin/accounts/apitoken/")
    assert victim.pk in {t.pk for t in listed.context["cl"].result_list}


def test_the_token_list_filters_by_user_role_and_usable_within_what_one_may_see(api, people):
    _as(api, people["admin"])
    mallorys = api.get(TOKENS, {"user": "mallory"}).json()
    assert [t["name"] for t in mallorys] == ["mallory's"]
    viewers = api.get(TOKENS, {"role": "viewer"}).json()
    assert [t["name"] for t in viewers] == ["vera's"]
    assert api.get(TOKENS, {"role": "king"}).status_code == 400
    # an operator filtering by another user still sees only their own: none of vera's
    _as(api, people["mallory"])
    assert api.get(TOKENS, {"user": "vera"}).json() == []
    assert [t["name"] for t in api.get(TOKENS, {"user": "mallory"}).json()] == ["mallory's"]
