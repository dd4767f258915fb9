"""The API's JSON parser: DRF's, with limits on nesting and on values, checked on the
text before anything is decoded.

Python's json module recurses once per level, so a body of 50,000 opening brackets
ends in RecursionError (a 500). And JSON needs three bytes for an empty list, which
Python holds in about 60, and a serializer then validates item by item: 0.57 MiB of
empty lists became 396 MiB of server memory (issue 29). So before decoding, the raw
text is scanned outside its strings, without recursion, for its bracket depth and its
count of values (every array item and object member, nested ones included, as the
SDK's msgpack reader counts its objects: lakeshore/msgpack_count.py). Anything deeper
than LAKESHORE_JSON_MAX_DEPTH, or holding more than LAKESHORE_JSON_MAX_VALUES values,
is refused with 400 "invalid" naming the setting (`refusal`)."""

import re
from itertools import accumulate

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest
from django.http.request import RawPostDataException
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils import json

# A JSON string, escapes included; an unterminated one runs to the end of the text.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
# Everything valid JSON holds outside strings, brackets aside.
_STRUCTURE = str.maketrans(dict.fromkeys(" \t\n\r,:0123456789+-.eEtrufalsn"))
_SQUARE = str.maketrans("{}", "[]")
_SPACE = str.maketrans(dict.fromkeys(" \t\n\r"))
_OTHER = re.compile(r"[^\[\]]")
_STEP = {"[": 1, "]": -1}


def _skeleton(text: str) -> str:
    """`text` with each string as one character and no whitespace: its structure."""
    return _STRING.sub("0", text).translate(_SPACE)


def json_depth(text: str, *, limit: int | None = None) -> int:
    """How deeply `text` nests arrays and objects (0 for a scalar), counting only the
    brackets outside strings. With `limit`, it may stop early at any answer above it."""
    if "[" not in text and "{" not in text:
        return 0
    return _depth(_skeleton(text), limit)


def json_values(text: str) -> int:
    """How many values `text` holds in its arrays and objects: each array's items and
    each object's members, nested ones included (0 for a scalar)."""
    if "[" not in text and "{" not in text:
        return 0
    return _values(_skeleton(text))


def _values(skeleton: str) -> int:
    """A container of n items holds n - 1 commas: the items are the commas outside
    strings plus one for each container that is not empty. On text that is not JSON
    this is at least what json.loads builds before it stops."""
    containers = skeleton.count("[") + skeleton.count("{")
    empty = skeleton.count("[]") + skeleton.count("{}")
    return skeleton.count(",") + containers - empty


def _depth(skeleton: str, limit: int | None) -> int:
    """No recursion and no Python loop per character, so a 10 MB body takes well under
    a second: str.translate drops everything but brackets, a few str.replace passes
    peel the innermost pairs (ordinary JSON ends there), and a running sum measures
    what is left. Text that is not JSON is measured up to its first stray character,
    where json.loads stops too."""
    brackets = skeleton.translate(_STRUCTURE).translate(_SQUARE)
    if stray := _OTHER.search(brackets):
        brackets = brackets[: stray.start()]
    peeled = 0
    while brackets and peeled < 4:
        if limit is not None and "[" * (limit - peeled + 1) in brackets:
            return limit + 1
        shorter = brackets.replace("[]", "")
        if len(shorter) == len(brackets):
            break
        peeled += 1
        brackets = shorter
    return peeled + max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def too_deep(limit: int | None = None) -> str:
    limit = settings.LAKESHORE_JSON_MAX_DEPTH if limit is None else limit
    return f"JSON nested deeper than {limit} levels."


def too_many_values(limit: int) -> str:
    return (
        f"The JSON holds more than {limit:,} values (array items and object members, "
        "nested ones included; LAKESHORE_JSON_MAX_VALUES)."
    )


def refusal(text: str) -> str | None:
    """Why `text` is refused before it is decoded (nested deeper than
    LAKESHORE_JSON_MAX_DEPTH, or more values than LAKESHORE_JSON_MAX_VALUES), or None.
    One scan of the text serves both counts."""
    if "[" not in text and "{" not in text:
        return None
    skeleton = _skeleton(text)
    most = settings.LAKESHORE_JSON_MAX_VALUES
    if _values(skeleton) > most:
        return too_many_values(most)
    deepest = settings.LAKESHORE_JSON_MAX_DEPTH
    if _depth(skeleton, deepest) > deepest:
        return too_deep(deepest)
    return None


def _read(stream) -> bytes:
    if isinstance(stream, HttpRequest):
        try:
            return stream.body  # refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE: 413
        except RawPostDataException:
            pass  # somebody read it as a stream already: read on
    return stream.read()


class DepthLimitedJSONParser(JSONParser):
    """JSON nested deeper than LAKESHORE_JSON_MAX_DEPTH, or holding more values than
    LAKESHORE_JSON_MAX_VALUES: 400 "invalid", never a 500 or hundreds of megabytes."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})
        try:
            text = _read(stream).decode(encoding)
        except ValueError as exc:  # UnicodeDecodeError
            raise ParseError(f"JSON parse error - {exc}") from None
        if (refused := refusal(text)) is not None:
            raise ParseError(refused)
        parse_constant = json.strict_constant if self.strict else None
        try:
            return json.loads(text, parse_constant=parse_constant)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


class DepthLimitedJSONFormField(forms.JSONField):
    """The same limits for JSON typed into a form (Django admin's JSONField widgets):
    too deep or too many values is a form error, not a RecursionError. Use it with
    `formfield_overrides = {models.JSONField: {"form_class": DepthLimitedJSONFormField}}`."""

    def _refusal(self, value) -> str | None:
        return refusal(value) if isinstance(value, str) and not self.disabled else None

    def to_python(self, value):
        if (refused := self._refusal(value)) is not None:
            raise ValidationError(refused, code="invalid")
        return super().to_python(value)

    def bound_data(self, data, initial):
        if self._refusal(data) is not None:
            return InvalidJSONInput(data)
        return super().bound_data(data, initial)
