"""Limits on guessing: bad bearer tokens per client address (here) and failed logins
(django-axes, configured in settings). Both count by `client_address`."""

from django.conf import settings
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle


def client_address(request) -> str:
    """REMOTE_ADDR, or behind LAKESHORE_PROXY_COUNT trusted proxies the address they saw
    (DRF's rule, with NUM_PROXIES set from that setting). Also axes' AXES_CLIENT_IP_CALLABLE."""
    return BaseThrottle().get_ident(request)


class BadTokensThrottled(exceptions.Throttled):
    default_detail = "Too many bad tokens from this address;"
    extra_detail_singular = extra_detail_plural = "try again in {wait} s."


class BadTokenThrottle(SimpleRateThrottle):
    """Failed token authentications per client address, in a sliding window of
    LAKESHORE_BAD_TOKEN_WINDOW seconds kept in Django's cache. The authentication class
    calls `check` only for a bad token, so a good token is never held back."""

    scope = "bad_token"

    def __init__(self):  # the limit comes from our settings, read at each bad token
        self.num_requests = settings.LAKESHORE_BAD_TOKEN_LIMIT
        self.duration = settings.LAKESHORE_BAD_TOKEN_WINDOW
        self.rate = f"{self.num_requests} per {self.duration} s" if self.num_requests else None

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": client_address(request)}

    def check(self, request) -> None:
        """Count one more bad token from this address; past the limit, raise 429."""
        if not self.allow_request(request, None):
            raise BadTokensThrottled(wait=self.wait())
