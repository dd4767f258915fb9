"""Typed domain errors. Services raise them; `api_errors` maps them to HTTP once.

Every error carries a stable machine-readable `code` (the `error.code` of the API's
error body). Clients — the CLI, the daemon, the console — branch on the code, never on
the message, which is for people and may change. The codes a service may pass are
listed in CODES, so a typo is caught at once rather than shipped."""

CODES = {
    # 400 / 404 / 429
    "invalid",
    "search_too_broad",  # 400: a search's reads passed LAKESHORE_SEARCH_TIMEOUT_SECONDS
    "not_found",
    "backlog_full",
    # 409: the state of something forbids the action
    "conflict",
    "already_exists",
    "queue_not_admitting",  # submit into a draining or archived queue
    "queue_state",  # drain/pause/... from a state that forbids it
    "queue_in_use",  # rm while daemons are bound, or invocations queued/running
    "provider_in_use",  # remove while queues use it or daemons run on it
    "invocation_running",  # kill of a running invocation (drop the daemon instead)
    "invocation_finished",  # kill of a finished invocation
    "invocation_not_running",  # daemon exec on an invocation that does not run
    "invocation_elsewhere",  # daemon exec on an invocation another daemon runs
    "invocation_not_retryable",  # retry of one that did not end badly
    "already_retried",  # retry of one retried before (names the retry)
    "daemon_terminated",  # the daemon was dropped or left: it must stop
    "daemon_lost",  # the reaper marked the daemon lost: register again
    "apply_refused",  # lakeshore apply: a removal in the plan is refused (the plan says why)
    "apply_in_progress",  # lakeshore apply: another apply holds the lock (nothing changed)
    "claim_stale",  # a completion for a claim the daemon no longer holds (with `state`
    # killed and the kill's `reason`: the kill came first, the outcome is kept as discarded)
    "already_completed",  # the same attempt was completed with another outcome
    "log_closed",  # log lines for an attempt that ended past LAKESHORE_LOG_APPEND_GRACE_SECONDS
    # 401 beyond DRF's not_authenticated / authentication_failed
    "token_revoked",  # a daemon's token is revoked when the server ends it: stop
    "token_expired",
    # the SDK's wire (jobs/sdk.py)
    "forbidden",  # 403: another user's worker, or a role that may not
    "namespace_unknown",  # 404: this server is one namespace
    "too_large",  # 413: a blob or frame above LAKESHORE_SDK_MAX_BLOB_BYTES
    "stream_full",  # 413: a result stream at its frame or byte limit
    "stream_not_yours",  # 403: a topic another credential opened (jobs/sdk.py)
    # 403: one daemon, one credential (fleet/registration.py)
    "not_your_daemon",  # another daemon's credential, or the token that registered it
    "queue_not_in_scope",  # a token scoped to queues, registering on another
    "provider_not_yours",  # registering as provider-run with a credential it did not mint
    # 429: a token that registers daemons has LAKESHORE_DAEMONS_PER_TOKEN live ones
    "daemons_per_token",
    # 403 / 409: whose tokens one may make, list and revoke (accounts/services.py)
    "not_your_token",  # another user's token: only an administrator acts for others
    "role_above_yours",  # a token of a role its maker does not hold
    "role_not_held",  # 409: the token's user lacks the role (an administrator may grant it)
    # 503 with Retry-After: every wait slot of the process is taken (jobs/waits.py), or
    # an apply waited LAKESHORE_APPLY_LOCK_TIMEOUT on a row; 429 with Retry-After: the
    # caller's own heavy requests take its share (accounts/heavy.py)
    "busy",
}


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(
        self,
        message: str,
        *,
        fields: dict | None = None,
        extra: dict | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        if code is not None:
            if code not in CODES:
                raise ValueError(f"unknown error code {code!r}: add it to CODES")
            self.code = code
        self.message = message
        self.fields = fields or {}
        self.extra = extra or {}


class Invalid(DomainError):
    """Bad input that a serializer cannot see (it depends on other fields or rows)."""

    status = 400
    code = "invalid"


class NotFound(DomainError):
    status = 404
    code = "not_found"


class Conflict(DomainError):
    """The object's state forbids the action (409). Pass a specific `code`."""

    status = 409
    code = "conflict"


class Forbidden(DomainError):
    status = 403
    code = "forbidden"


class TooLarge(DomainError):
    status = 413
    code = "too_large"


class BacklogFull(DomainError):
    status = 429
    code = "backlog_full"


class QuotaReached(DomainError):
    """A principal holds as many of something as its limit allows (429): one must end
    before another is admitted. Pass a specific `code`."""

    status = 429


class Busy(DomainError):
    """The server cannot take this now; the client may try again after `retry_after`
    seconds (the answer's Retry-After header)."""

    status = 503
    code = "busy"

    def __init__(self, message: str, *, retry_after: int, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class TooManyAtOnce(Busy):
    """The caller already has as many requests of this kind running as it may (429):
    it may send this one again after `retry_after` seconds."""

    status = 429
