from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import audit
from accounts.models import ApiToken, Role
from accounts.roles import acts_with, grant, may_hold
from lakeshore_admin.errors import Conflict, Forbidden, Invalid

MAX_TOKEN_QUEUES = 64
QUEUE_NAME_MAX = 63
# What makes a user an administrator of tokens (with is_staff and is_active): Django's
# own permissions on the token model, which a superuser holds.
TOKEN_ADMIN_PERMISSIONS = (
    "accounts.view_apitoken",
    "accounts.add_apitoken",
    "accounts.change_apitoken",
)


# ---------------------------------------------------------------------------- who may


def is_token_admin(user) -> bool:
    """An administrator: active Django staff holding the token model's view, add and
    change permissions (a superuser holds them). Only an administrator lists, makes or
    revokes other users' tokens, and grants a role."""
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_active
        and user.is_staff
        and user.has_perms(TOKEN_ADMIN_PERMISSIONS)
    )


def tokens_visible_to(user):
    """The tokens `user` may list and revoke: every one for an administrator, the
    user's own for anyone else."""
    tokens = ApiToken.objects.select_related("user")
    return tokens if is_token_admin(user) else tokens.filter(user=user)


def _check_acts_for(actor, username: str) -> None:
    if username != actor.get_username() and not is_token_admin(actor):
        raise Forbidden(
            f"Only an administrator acts on the tokens of another user ({username[:150]}): "
            "you make, list and revoke your own.",
            code="not_your_token",
        )


# ---------------------------------------------------------------------------- make


def token_mint(
    *,
    actor,
    username: str,
    role: str,
    name: str = "",
    expires_at=None,
    queues: list[str] | None = None,
    grant_role: bool = False,
) -> tuple[ApiToken, str]:
    """A token made for a request's user (the API): `actor` makes its own tokens, of a
    role within its own (a viewer token of an operator reads only); only an
    administrator makes one for another user. The token's user must already hold its
    role: a token never grants one. An administrator may grant it in the same step,
    by asking (`grant_role`), and the grant is audited on its own."""
    _check_role(role)
    if not username:
        raise Invalid("A user name is required.", fields={"user": "required"})
    _check_acts_for(actor, username)
    if not acts_with(actor, role):
        raise Forbidden(
            f"You may not make a {role} token: it would do more than you may.",
            fields={"role": "above yours"},
            code="role_above_yours",
        )
    scope = _queue_scope(queues, role)
    with transaction.atomic():
        user = get_user_model().objects.filter(username=username).first()
        if user is None or not may_hold(user, role):
            if not (grant_role and is_token_admin(actor)):
                raise Conflict(
                    f"User {username[:150]!r} does not hold the {role} role, and a token "
                    "grants none: an administrator grants it (Django admin's groups, or "
                    "grant_role with the token).",
                    fields={"role": "not held by the user"},
                    code="role_not_held",
                )
            user = user or get_user_model().objects.create(username=username)
            _grant(user, role)
        return _issue(user=user, role=role, name=name, expires_at=expires_at, scope=scope)


@transaction.atomic
def token_create(
    *,
    username: str,
    role: str,
    name: str = "",
    expires_at=None,
    queues: list[str] | None = None,
    audited: bool = True,
) -> tuple[ApiToken, str]:
    """The server owner's (`manage.py create_token`, `bootstrap`), never a request's:
    create the user if needed, grant it `role` unless it holds it already,
    and issue a new token of that role (returned raw once): a viewer token made for an
    operator only reads. `queues` scopes a daemon token: the daemons it registers may
    serve those queues only. Recorded in the audit trail unless `audited` is False (a
    provider's own daemon tokens, made and revoked with each daemon it starts)."""
    _check_role(role)
    if not username:
        raise Invalid("A user name is required.", fields={"user": "required"})
    scope = _queue_scope(queues, role)
    user, _ = get_user_model().objects.get_or_create(username=username)
    if not may_hold(user, role):
        grant(user, role)
    return _issue(
        user=user, role=role, name=name, expires_at=expires_at, scope=scope, audited=audited
    )


def _check_role(role: str) -> None:
    if role not in Role.values:
        raise Invalid(
            f"Unknown role {role!r}: use one of {', '.join(Role.values)}.",
            fields={"role": "unknown"},
        )


def _grant(user, role: str) -> None:
    grant(user, role)
    audit.record(
        "role.grant", target=f"user {user.get_username()}"[:100], summary=f"granted {role}"
    )


def _issue(*, user, role, name, expires_at, scope, audited=True) -> tuple[ApiToken, str]:
    token, raw = ApiToken.issue(
        user=user, role=role, name=name or f"{role} token", expires_at=expires_at, queues=scope
    )
    if audited:
        scoped = f" for queues {', '.join(scope)}" if scope else ""
        audit.record(
            "token.create",
            target=f"token {token.prefix}…",
            summary=f"{role} token for {user.get_username()}{scoped}"
            + (f" ({name})" if name else ""),
        )
    return token, raw


def _queue_scope(queues: list[str] | None, role: str) -> list[str] | None:
    if queues is None:
        return None
    if role != Role.DAEMON:
        raise Invalid(
            "Only daemon tokens are scoped to queues (--queues needs --role daemon).",
            fields={"queues": "daemon tokens only"},
        )
    names = list(dict.fromkeys(q.strip() for q in queues if q.strip()))
    if not names:
        raise Invalid("Name at least one queue to scope the token to.", fields={"queues": "empty"})
    if len(names) > MAX_TOKEN_QUEUES:
        raise Invalid(
            f"A token may be scoped to at most {MAX_TOKEN_QUEUES} queues.",
            fields={"queues": "too many"},
        )
    long = [n for n in names if len(n) > QUEUE_NAME_MAX]
    if long:
        raise Invalid(
            f"A queue name has at most {QUEUE_NAME_MAX} characters: {long[0][:80]!r}.",
            fields={"queues": "too long"},
        )
    return names


def service_user(username: str, role: str):
    """The user a service acts as (a provider's daemons: `provider-<name>`), holding
    `role`; made on first use."""
    user, _ = get_user_model().objects.get_or_create(username=username)
    if not may_hold(user, role):
        grant(user, role)
    return user


def credential_issue(*, user, name: str, queues: list[str]) -> tuple[ApiToken, str]:
    """A daemon's own credential (returned raw once): the daemon role, bound to the one
    daemon whose token it becomes, scoped to that daemon's queues. Not audited: it is
    made and revoked with its daemon."""
    return ApiToken.issue(
        user=user, role=Role.DAEMON, name=f"daemon {name}"[:100], queues=queues or None, bound=True
    )


def token_revoke(*, actor, token: ApiToken) -> bool:
    """Revoke a token (at once: the per-process token cache honours it within seconds);
    False if it was already revoked. `actor` revokes its own tokens; an administrator
    any. Recorded in the audit trail."""
    _check_acts_for(actor, token.user.get_username())
    was_live = token.revoked_at is None
    token.revoke()
    if was_live:
        audit.record(
            "token.revoke", target=f"token {token.prefix}…", summary=f"revoked {token.name}"
        )
    return was_live
