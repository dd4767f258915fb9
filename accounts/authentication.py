from django.utils import timezone
from rest_framework import authentication, exceptions

from accounts.models import ApiToken, hash_token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`; the token is looked up by its hash."""

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if not header or header[0].lower() != self.keyword:
            return None
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
