import math
import threading
import time

from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from django.conf import settings
from django.shortcuts import render
from django.utils import timezone
from rest_framework import authentication, exceptions

from accounts.models import ApiToken, hash_token
from accounts.roles import bind_token
from accounts.throttles import BadTokenThrottle

WATCHED_SECONDS = 600  # a daemon's own credential, while this process hears changes


class _TokenCache:
    """Tokens that authenticated, with their user and roles, kept for a few seconds per
    process (LAKESHORE_TOKEN_CACHE_SECONDS): a daemon polling several times a second
    costs no token or role query. A revoked or expired token, or a disabled user, is
    refused at most that many seconds late; unknown tokens are never kept.

    A daemon's own credential is kept LAKESHORE_CREDENTIAL_CACHE_SECONDS, and up to
    WATCHED_SECONDS while this process hears every change of tokens and users (`watch`:
    jobs/wakeup.py's listener, while it is connected; the triggers of
    accounts/migrations/0006): a change of the token (its revocation, expiry, role,
    queues) or of its user (deactivated, its roles) drops it at once (`forget`). An
    entry made while the listener was down, or read from the database before a change
    was heard, keeps only the shorter time."""

    def __init__(self):
        self._lock = threading.Lock()
        # digest → (until, until while watched, the watch it was made under, token)
        self._entries: dict[str, tuple[float, float, object, ApiToken]] = {}
        self._watch: object | None = None  # a new object each time the listener connects
        self.changes = 0  # bumped by every forget and every change of watch

    def get(self, digest: str) -> ApiToken | None:
        with self._lock:
            hit = self._entries.get(digest)
            watch = self._watch
        if hit is None:
            return None
        now = time.monotonic()
        if now < hit[0] or (hit[2] is watch and watch is not None and now < hit[1]):
            return hit[3]
        return None

    def put(
        self, digest: str, token: ApiToken, ttl: float, *, watched: float = 0, seen=None
    ) -> None:
        """Keep `token` `ttl` seconds, or `watched` seconds while this process hears its
        changes, if none was heard since `changes` was `seen` (before it was read)."""
        now = time.monotonic()
        with self._lock:
            watch = self._watch if seen == self.changes else None
            if watch is None or watched <= ttl:
                watched = 0
            if max(ttl, watched) <= 0:
                return
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[digest] = (now + ttl, now + watched, watch, token)

    def watch(self, on: bool) -> None:
        """The listener connected (on) or lost its connection: entries made under an
        earlier watch keep only their shorter time."""
        with self._lock:
            self._watch = object() if on else None
            self.changes += 1

    def forget(self, *, token_id: int | None = None, user_id: int | None = None) -> None:
        """A token, or a user's tokens, changed: drop them."""
        with self._lock:
            self.changes += 1
            for digest, entry in list(self._entries.items()):
                if entry[3].pk == token_id or entry[3].user_id == user_id:
                    del self._entries[digest]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


token_cache = _TokenCache()


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
        return authenticate_token(header[1])

    def authenticate_header(self, request):
        return 'Bearer realm="lakeshore"'


def kept_token(raw: str):
    """(user, token) when this process keeps `raw` (token_cache) and it may still be
    used; else None. No query: an event loop may ask."""
    return _kept(hash_token(raw))


def _kept(digest: str):
    kept = token_cache.get(digest)
    return (kept.user, kept) if kept is not None and kept.is_usable else None


def authenticate_token(raw: str):
    """(user, token) for a bearer token, or AuthenticationFailed saying why. DRF's
    authentication above and the lean path (edge/lean_path.py) both ask here."""
    digest = hash_token(raw)
    if (kept := _kept(digest)) is not None:
        return kept
    seen = token_cache.changes  # before the read: a change heard after it shortens its stay
    token = ApiToken.objects.select_related("user").filter(digest=digest).first()
    if token is None:
        raise exceptions.AuthenticationFailed(
            "Invalid token: create one with 'python manage.py create_token' or "
            "'make token', then 'lakeshore auth login'."
        )
    if not token.is_usable:
        state = "revoked" if token.revoked_at else "expired"
        raise exceptions.AuthenticationFailed(
            f"Token {token.prefix}… is {state}.", code=f"token_{state}"
        )
    if not token.user.is_active:
        raise exceptions.AuthenticationFailed("The token's user is disabled.")
    bind_token(token.user, token)  # the request acts with the token's role, not the user's
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        # At most one write a minute per token: reads stay reads.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    ttl, watched = settings.LAKESHORE_TOKEN_CACHE_SECONDS, 0
    if token.bound:  # a daemon's own credential: see LAKESHORE_CREDENTIAL_CACHE_SECONDS
        ttl = max(ttl, settings.LAKESHORE_CREDENTIAL_CACHE_SECONDS)
        watched = WATCHED_SECONDS if settings.LAKESHORE_CREDENTIAL_CACHE_SECONDS else 0
    token_cache.put(digest, token, ttl, watched=watched, seen=seen)
    return token.user, token


def recheck_token(token: ApiToken) -> None:
    """AuthenticationFailed, as authenticate_token says it, when `token` was revoked or
    expired since it authenticated this request (read afresh, past the cache): a
    long-poll woken after its credential was revoked takes no work with it."""
    fresh = ApiToken.objects.filter(pk=token.pk).only("revoked_at", "expires_at").first()
    if fresh is None or not fresh.is_usable:
        state = "expired" if fresh is not None and fresh.revoked_at is None else "revoked"
        raise exceptions.AuthenticationFailed(
            f"Token {token.prefix}… is {state}.", code=f"token_{state}"
        )


def login_locked_out(request, original_response=None, credentials=None):
    """django-axes' answer to a locked-out login (AXES_LOCKOUT_CALLABLE): a page that says
    the login is locked and for how long, with 429 like axes' own answer."""

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
