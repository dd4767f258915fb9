import math

from django.shortcuts import render
from django.utils import timezone
from rest_framework import authentication, exceptions

from accounts.models import ApiToken, hash_token
from accounts.throttles import BadTokenThrottle


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`; the token is looked up by its hash."""

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword:
            return None
        try:
            return self._authenticate(header)
        except exceptions.AuthenticationFailed:
            BadTokenThrottle().check(request)  # past the limit: 429 instead of 401
            raise

    def _authenticate(self, header: list[str]):
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <token>'."
            )
        token = ApiToken.objects.select_related("user").filter(digest=hash_token(header[1])).first()
        if token is None:
            raise exceptions.AuthenticationFailed(
                "Invalid token: create one with 'python manage.py create_token' or "
                "'make token', then 'lakeshore auth login'."
            )
        if not token.is_usable:
            state = "revoked" if token.revoked_at else "expired"
            raise exceptions.AuthenticationFailed(f"Token {token.prefix}… is {state}.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is disabled.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            # At most one write a minute per token: reads stay reads.
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="lakeshore"'


def login_locked_out(request, original_response=None, credentials=None):
    """django-axes' answer to a locked-out login (AXES_LOCKOUT_CALLABLE): a page that says
    the login is locked and for how long, with 429 like axes' own answer."""
    from axes.helpers import get_client_username, get_cool_off, get_failure_limit

    cool_off = get_cool_off(request)
    return render(
        request,
        "registration/locked_out.html",
        {
            "username": get_client_username(request, credentials) or "",
            "minutes": math.ceil(cool_off.total_seconds() / 60) if cool_off else None,
            "failure_limit": get_failure_limit(request, credentials),
        },
        status=429,
    )
