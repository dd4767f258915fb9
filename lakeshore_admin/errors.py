"""Typed domain errors. Services raise them; `api_errors` maps them to HTTP once."""


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, *, fields: dict | None = None, extra: dict | None = None):
        super().__init__(message)
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
    """The object's state forbids the action (409)."""

    status = 409
    code = "conflict"


class BacklogFull(DomainError):
    status = 429
    code = "backlog_full"
