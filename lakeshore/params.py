"""Parameter types and checks shared by the command groups (usage errors: exit 2)."""

import json
import re

import click

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"
NAME_MAX_LENGTH = 63


def options(*decorators):
    """Several click options as one decorator, in the order given (shared flag sets)."""

    def decorator(command):
        for option in reversed(decorators):
            command = option(command)
        return command

    return decorator


def given(**values) -> dict:
    """The values the user gave (None means not given; "" is given: it clears a field)."""
    return {key: value for key, value in values.items() if value is not None}


def check_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if len(value) > NAME_MAX_LENGTH or not re.fullmatch(NAME_PATTERN[1:-1], value):
        raise click.BadParameter(
            f"{value!r} is not a valid name: use lower-case letters, digits and '-', "
            f"starting with a letter or digit ({NAME_PATTERN}), at most "
            f"{NAME_MAX_LENGTH} characters.",
            ctx,
            param,
        )
    return value


class HyphenatedChoice(click.Choice):
    """A choice of hyphenated words that names the right spelling when given underscores
    (`pool_with_threshold` is the lakeshore.yaml and API spelling, not the flag's)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and "_" in value:
            hyphenated = value.replace("_", "-")
            if hyphenated in self.choices:
                self.fail(
                    f"{value!r} is the lakeshore.yaml spelling; the flag takes {hyphenated!r}.",
                    param,
                    ctx,
                )
        return super().convert(value, param, ctx)


class JsonOf(click.ParamType):
    """A JSON value of one type given as a flag: an object (--config, --kwargs) or an
    array (--args)."""

    name = "JSON"
    EXAMPLES: dict[type, str] = {
        dict: 'a JSON object such as \'{"key": "value"}\'',
        list: "a JSON array such as '[1, \"two\"]'",
    }

    def __init__(self, kind: type):
        self.kind = kind

    def convert(self, value, param, ctx):
        if isinstance(value, self.kind):
            return value
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            self.fail(f"not valid JSON ({exc}): {value!r}", param, ctx)
        if not isinstance(parsed, self.kind):
            self.fail(f"must be {self.EXAMPLES[self.kind]}: {value!r}", param, ctx)
        return parsed


def reject_option(flag: str, message: str):
    """A hidden option that exists only to refuse itself with a helpful usage error."""

    def callback(ctx: click.Context, param: click.Parameter, value) -> None:
        if value is not None:
            raise click.UsageError(message, ctx)

    return click.option(flag, hidden=True, expose_value=False, callback=callback, is_eager=True)
