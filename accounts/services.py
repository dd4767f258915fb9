from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.models import ApiToken, Role
from accounts.roles import grant
from lakeshore_admin.errors import Invalid


@transaction.atomic
def token_create(
    *, username: str, role: str, name: str = "", expires_at=None
) -> tuple[ApiToken, str]:
    """Create the user if needed, give it `role`, and issue a new token (returned raw once)."""
    if role not in Role.values:
        raise Invalid(
            f"Unknown role {role!r}: use one of {', '.join(Role.values)}.",
            fields={"role": "unknown"},
        )
    if not username:
        raise Invalid("A user name is required.", fields={"user": "required"})
    user, _ = get_user_model().objects.get_or_create(username=username)
    grant(user, role)
    return ApiToken.issue(user=user, name=name or f"{role} token", expires_at=expires_at)
