"""The names operators give things (queues, providers): one rule for every app."""

from django.core.validators import RegexValidator

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
NAME_MAX_LENGTH = 63
name_validator = RegexValidator(
    NAME_PATTERN,
    "Names use lower-case letters, digits and '-', starting with a letter or digit "
    "(^[a-z0-9][a-z0-9-]*$).",
)

# The default queue has no name (a job's queue is '', a daemon serving it subscribes to
# none). Where an address or a list needs one, it is this, which no queue can be named:
# /api/v1/queues/(default)/stats/, the console's /queues/(default)/, ?queue=(default).
DEFAULT_QUEUE_LABEL = "(default)"
