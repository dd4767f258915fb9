from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import audit
from accounts.models import ApiToken, Role
from accounts.roles import grant, may_hold
from lakeshore_admin.errors import Invalid

MAX_TOKEN_QUEUES = 64
QUEUE_NAME_MAX = 63


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
    """Create the user if needed, give it `role` unless it holds more already, and issue
    a new token of that role (returned raw once): a viewer token made for an operator
    only reads. `queues` scopes a daemon token: the daemons it registers may serve
    those queues only. Recorded in the audit trail unless `audited` is False (a
    provider's own daemon tokens, made and revoked with each daemon it starts)."""
    if role not in Role.values:
        raise Invalid(
            f"Unknown role {role!r}: use one of {', '.join(Role.values)}.",
            fields={"role": "unknown"},
        )
    if not username:
        raise Invalid("A user name is required.", fields={"user": "required"})
    scope = _queue_scope(queues, role)
    user, _ = get_user_model().objects.get_or_create(username=username)
    if not may_hold(user, role):
        grant(user, role)
    token, raw = ApiToken.issue(
        user=user, role=role, name=name or f"{role} token", expires_at=expires_at, queues=scope
    )
    if audited:
        scoped = f" for queues {', '.join(scope)}" if scope else ""
        audit.record(
            "token.create",
            target=f"token {token.prefix}…",
            summary=f"{role} token for {username}{scoped}" + (f" ({name})" if name else ""),
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


def token_revoke(token: ApiToken) -> bool:
    """Revoke a token (at once: the per-process token cache honours it within seconds);
    False if it was already revoked. Recorded in the audit trail."""
    was_live = token.revoked_at is None
    token.revoke()
    if was_live:
        audit.record(
            "token.revoke", target=f"token {token.prefix}…", summary=f"revoked {token.name}"
        )
    return was_live
