"""The names operators give things (queues, providers): one rule for every app."""

from django.core.validators import RegexValidator

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
NAME_MAX_LENGTH = 63
name_validator = RegexValidator(
    NAME_PATTERN,
    "Names use lower-case letters, digits and '-', starting with a letter or digit "
    "(^[a-z0-9][a-z0-9-]*$).",
)
