"""The CLI's errors and the one place that prints them (stderr, `error: ...`)."""

from lakeshore.output import echo

# API field names → the flag a user types to set them.
FLAG_NAMES = {
    "name": "NAME",
    "kind": "--kind",
    "description": "--description",
    "provider": "--provider",
    "elasticity": "--elasticity",
    "elasticity.kind": "--elasticity",
    "elasticity.min": "--min",
    "elasticity.max": "--max",
    "elasticity.threshold": "--threshold",
    "instance_type": "--instance-type",
    "image_id": "--image-id",
    "runner": "--runner",
    "max_depth": "--max-depth",
    "on_full": "--on-full",
    "temperature": "--temperature",
    "config": "--config",
    "limit": "--limit",
    "state": "--state",
    "queue": "--queue",
}

LOGIN_HINT = "hint: run 'lakeshore auth login' or set LAKESHORE_TOKEN"


def refused_token_hint(source: str | None) -> str:
    """What to do when the server refused the token (401), naming where it came from:
    --token, an environment variable (LAKESHORE_CLIENT_TOKEN or LAKESHORE_TOKEN), or the
    saved auth file; LOGIN_HINT when there was none."""
    if source is None:
        return LOGIN_HINT
    if source == "--token":  # noqa: S105 - where the token came from, not a token
        return "hint: the token given with --token was refused (revoked or expired?)"
    if source.startswith("LAKESHORE_"):
        return (
            f"hint: the token in ${source} was refused (revoked or expired?): set {source} "
            "to a valid token, or unset it to use the one 'lakeshore auth login' saves"
        )
    return (
        f"hint: the token saved in {source} was refused (revoked or expired?): "
        "run 'lakeshore auth login' again"
    )


class CliError(Exception):
    """A failure to report as `error: message` and exit 1 (no traceback)."""

    exit_code = 1

    def __init__(self, message: str, *, fields: dict | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.fields = fields or {}
        self.hint = hint


class ApiError(CliError):
    """The server refused the request (4xx/5xx)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        fields: dict | None = None,
        detail: dict | None = None,
    ):
        super().__init__(message, fields=fields, hint=LOGIN_HINT if status == 401 else None)
        self.status = status
        self.code = code
        self.detail = detail or {}  # the whole `error` object of the answer


class Unreachable(CliError):
    def __init__(self, server: str, reason: str):
        super().__init__(
            f"cannot reach the Lakeshore server at {server} ({reason}). Is it running? "
            "Start it with 'make run', or set --url / LAKESHORE_URL."
        )


def report(error: CliError) -> None:
    fields = error.fields
    summary_only = getattr(error, "code", "") == "invalid"
    if fields and summary_only and all(m in error.message for m in fields.values()):
        # The server's message only lists the field errors: say them once, by flag.
        echo("error: invalid input", err=True)
    else:
        echo(f"error: {error.message}", err=True)
        fields = {f: m for f, m in fields.items() if m not in error.message}
    for field, message in fields.items():
        if field in ("", "__all__"):
            echo(f"  {message}", err=True)
        else:
            echo(f"  {FLAG_NAMES.get(field, field)}: {message}", err=True)
    if error.hint:
        echo(error.hint, err=True)
