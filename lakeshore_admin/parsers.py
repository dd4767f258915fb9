"""The API's JSON parser: DRF's, with a limit on nesting.

Python's json module recurses once per level, so a body of 50,000 opening brackets
ends in RecursionError (a 500). Before decoding, the raw text is scanned for its
bracket depth outside strings, without recursion, and anything deeper than
LAKESHORE_JSON_MAX_DEPTH is refused with 400 "invalid"."""

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
_OTHER = re.compile(r"[^\[\]]")
_STEP = {"[": 1, "]": -1}


def json_depth(text: str, *, limit: int | None = None) -> int:
    """How deeply `text` nests arrays and objects (0 for a scalar), counting only the
    brackets outside strings. With `limit`, it may stop early at any answer above it.

    No recursion and no Python loop per character, so a 10 MB body takes well under
    a second: regular expressions and str.translate drop the strings and everything
    but brackets, a few str.replace passes peel the innermost pairs (ordinary JSON
    ends there), and a running sum measures what is left. Text that is not JSON is
    measured up to its first stray character, where json.loads stops too."""
    if "[" not in text and "{" not in text:
        return 0
    brackets = _STRING.sub("", text).translate(_STRUCTURE).translate(_SQUARE)
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


def _read(stream) -> bytes:
    if isinstance(stream, HttpRequest):
        try:
            return stream.body  # refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE: 413
        except RawPostDataException:
            pass  # somebody read it as a stream already: read on
    return stream.read()


class DepthLimitedJSONParser(JSONParser):
    """JSON nested deeper than LAKESHORE_JSON_MAX_DEPTH: 400 "invalid", never a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})
        try:
            text = _read(stream).decode(encoding)
        except ValueError as exc:  # UnicodeDecodeError
            raise ParseError(f"JSON parse error - {exc}") from None
        limit = settings.LAKESHORE_JSON_MAX_DEPTH
        if json_depth(text, limit=limit) > limit:
            raise ParseError(too_deep(limit))
        parse_constant = json.strict_constant if self.strict else None
        try:
            return json.loads(text, parse_constant=parse_constant)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


class DepthLimitedJSONFormField(forms.JSONField):
    """The same limit for JSON typed into a form (Django admin's JSONField widgets):
    too deep is a form error, not a RecursionError. Use it with
    `formfield_overrides = {models.JSONField: {"form_class": DepthLimitedJSONFormField}}`."""

    def _too_deep(self, value) -> bool:
        limit = settings.LAKESHORE_JSON_MAX_DEPTH
        return isinstance(value, str) and json_depth(value, limit=limit) > limit

    def to_python(self, value):
        if not self.disabled and self._too_deep(value):
            raise ValidationError(too_deep(), code="invalid")
        return super().to_python(value)

    def bound_data(self, data, initial):
        if not self.disabled and self._too_deep(data):
            return InvalidJSONInput(data)
        return super().bound_data(data, initial)
