"""The one HTTP helper: base URL, bearer token, JSON, errors, `Link: rel="next"` pages."""

from typing import Any
from urllib.parse import quote

import httpx

from lakeshore import __version__
from lakeshore.errors import ApiError, CliError, Unreachable

API_PREFIX = "/api/v1/"
TIMEOUT_SECONDS = 40.0  # above the server's 30 s wait for a full backlog (on_full=block)
LONG_POLL_MARGIN = 20.0  # seconds a long-poll's answer may take past its wait


def long_poll(wait: float) -> float:
    """The timeout of a request that may wait `wait` seconds on the server."""
    return max(TIMEOUT_SECONDS, wait + LONG_POLL_MARGIN)


# Seconds an idle kept-alive connection may be used again: well under a server's own
# keep-alive (ours keeps one 20 s, lakeshore_admin/gunicorn_conf.py; a proxy in front may
# keep it 5 s), so that a request never goes out on a connection the server is closing
# at that moment (the request would fail, and a daemon retry it).
KEEPALIVE_EXPIRY = 4.0
LIMITS = httpx.Limits(
    max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_EXPIRY
)

MAX_PAGES = 10_000
RETRY_AFTER_MAX = 300.0  # seconds: a longer Retry-After is read as this


def path(*segments: object) -> str:
    """`path("queues", name, "drain")` → `queues/<name>/drain/`, each segment as str()
    spells it, quoted."""
    return "".join(f"{quote(str(segment), safe='')}/" for segment in segments)


class Client:
    def __init__(
        self, server: str, token: str | None, transport: httpx.BaseTransport | None = None
    ):
        self.server = server.rstrip("/")
        self.token = token
        headers = {"Accept": "application/json", "User-Agent": f"lakeshore-cli/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            self.http = httpx.Client(
                base_url=self.server + API_PREFIX,
                headers=headers,
                timeout=TIMEOUT_SECONDS,
                limits=LIMITS,
                transport=transport,
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise CliError(f"invalid server URL {server!r}: {exc}") from exc

    def request(self, method: str, url: str, *, params=None, json=None, token=None) -> Any:
        return self.decode(self.send(method, url, params=params, json=json, token=token))

    def use_token(self, token: str) -> None:
        """Speak with `token` from now on (a daemon's own credential, once registered)."""
        self.token = token
        self.http.headers["Authorization"] = f"Bearer {token}"

    def get(self, url: str, **params) -> Any:
        return self.request("GET", url, params=_clean(params))

    def get_all(self, url: str, **params) -> list:
        """Every page of a list: follows `Link: <url>; rel="next"` until there is none."""
        response = self.send("GET", url, params=_clean(params))
        items = list(self.decode(response))
        seen = {str(response.url)}
        while (next_url := response.links.get("next", {}).get("url")) and len(seen) < MAX_PAGES:
            if next_url in seen:
                break
            seen.add(next_url)
            response = self.send("GET", next_url)
            items.extend(self.decode(response))
        return items

    def post(self, url: str, json=None, **params) -> Any:
        return self.request("POST", url, params=_clean(params), json=json)

    def patch(self, url: str, json, **params) -> Any:
        return self.request("PATCH", url, params=_clean(params), json=json)

    def delete(self, url: str, **params) -> Any:
        return self.request("DELETE", url, params=_clean(params))

    def send(
        self,
        method: str,
        url: str,
        *,
        params=None,
        json=None,
        content: bytes | None = None,
        token=None,
        timeout=None,
    ) -> httpx.Response:
        """`token` speaks this one request with another token than the client's.
        `timeout`: seconds this one request may take (a long-poll), else TIMEOUT_SECONDS.
        `content`: a body already encoded as JSON (one measured while it was built)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = self.http.request(
                method,
                url,
                params=params,
                json=json,
                content=content,
                headers=headers or None,
                timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
            )
        except httpx.TimeoutException as exc:
            raise CliError(
                f"the Lakeshore server at {self.server} did not answer in time ({exc or 'timeout'})"
            ) from exc
        except httpx.TransportError as exc:
            raise Unreachable(self.server, str(exc) or type(exc).__name__) from exc
        except httpx.InvalidURL as exc:
            raise CliError(f"invalid server URL {self.server!r}: {exc}") from exc
        if response.is_error:
            raise _api_error(response)
        return response

    def decode(self, response: httpx.Response) -> Any:
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise CliError(
                f"the server at {self.server} answered {response.status_code} with something "
                f"that is not JSON: is {self.server} a Lakeshore server?"
            ) from exc


def _clean(params: dict) -> dict:
    """Drop unset query parameters; booleans as the API spells them."""
    out = {}
    for key, value in params.items():
        if value is None or value is False:
            continue
        out[key] = "true" if value is True else value
    return out


def _api_error(response: httpx.Response) -> ApiError:
    try:
        error = response.json()["error"]
        message = str(error.get("message") or response.reason_phrase)
        fields = error.get("fields")
        fields = {str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else {}
        code = str(error.get("code", ""))
        return ApiError(response.status_code, code, message, fields, detail=error)
    except (ValueError, KeyError, TypeError, AttributeError):
        reason = f"{response.status_code} {response.reason_phrase}".strip()
        return ApiError(
            response.status_code, "", f"the server answered {reason} for {response.url}"
        )


def retry_after(response: httpx.Response) -> float | None:
    """The seconds of the answer's Retry-After header (its delay-seconds form), if any."""
    raw = response.headers.get("Retry-After", "").strip()
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return min(seconds, RETRY_AFTER_MAX) if seconds > 0 else None
