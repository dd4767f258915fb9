from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import audit
from accounts.models import ApiToken, Role
from accounts.roles import grant
from lakeshore_admin.errors import Invalid


@transaction.atomic
def token_create(
    *, username: str, role: str, name: str = "", expires_at=None, audited: bool = True
) -> tuple[ApiToken, str]:
    """Create the user if needed, give it `role`, and issue a new token (returned raw once).
    Recorded in the audit trail unless `audited` is False (a provider's own daemon tokens,
    made and revoked with each daemon it starts)."""
    if role not in Role.values:
        raise Invalid(
            f"Unknown role {role!r}: use one of {', '.join(Role.values)}.",
            fields={"role": "unknown"},
        )
    if not username:
        raise Invalid("A user name is required.", fields={"user": "required"})
    user, _ = get_user_model().objects.get_or_create(username=username)
    grant(user, role)
    token, raw = ApiToken.issue(user=user, name=name or f"{role} token", expires_at=expires_at)
    if audited:
        audit.record(
            "token.create",
            target=f"token {token.prefix}…",
            summary=f"{role} token for {username}" + (f" ({name})" if name else ""),
        )
    return token, raw


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
