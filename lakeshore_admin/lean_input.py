"""Input validation without DRF's per-request serializer set-up, for the hot paths
(submit, batch submit, the daemon protocol). `validated(SerializerClass, data)` gives
exactly what `SerializerClass(data=data).is_valid(raise_exception=True)` then
`.validated_data` gives: one instance of each serializer class per thread, built once;
the fields in DRF's order with DRF's rules, a plain field with a value of the obvious
type checked directly (its validators still run), every other field and value through
the field's own run_validation; anything that does not pass is validated again by DRF
itself, from scratch, so every error a client sees is DRF's, word for word
(tests/api/test_lean_input.py checks the two agree on generated input). Why:
docs/decisions/0004-the-hot-statements.md."""

import contextlib
import threading

from rest_framework import serializers
from rest_framework.fields import SkipField, empty

from lakeshore_admin.strict_input import StrictInput

_local = threading.local()

_CHAR, _INT, _FLOAT, _BOOL, _CHOICE, _FIELD, _LIST, _BOUNDED = range(8)
_KINDS = {
    serializers.CharField: _CHAR,
    serializers.IntegerField: _INT,
    serializers.FloatField: _FLOAT,
    serializers.BooleanField: _BOOL,
    serializers.ChoiceField: _CHOICE,
}


class _Refused(Exception):
    """The lean path does not decide: DRF validates again and says why."""


def validated(cls, data, *, many: bool = False):
    """What cls(data=data[, many=True]) validates to, or DRF's ValidationError."""
    plan = _plan_for(cls)
    if plan is not None:
        try:
            if many:
                if type(data) is not list:
                    raise _Refused
                return [_run(plan, item) for item in data]
            return _run(plan, data)
        except (_Refused, serializers.ValidationError, SkipField):
            pass
        except (TypeError, ValueError, OverflowError, AttributeError, KeyError):
            pass  # a value of a shape the lean path did not expect: DRF's turn
    serializer = cls(data=data, many=many)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _plan_for(cls):
    plans = _local.__dict__.setdefault("plans", {})
    if cls not in plans:
        plans[cls] = _compile(cls())
    return plans[cls]


def _compile(template):
    """The template's fields as steps, or None when the class is not one the lean path
    can reproduce (its own to_internal_value, serializer-wide validators, read-only or
    dotted fields)."""
    cls = type(template)
    if not isinstance(template, StrictInput) or cls.to_internal_value is not (
        StrictInput.to_internal_value
    ):
        return None
    if template.validators:
        return None
    steps = []
    for name, field in template.fields.items():
        if field.read_only or len(field.source_attrs) != 1:
            return None
        kind, child = _KINDS.get(type(field), _FIELD), None
        if isinstance(field, serializers.ListField) and field.max_length is not None:
            kind = _BOUNDED  # its length before its items, as StrictInput looks
        if type(field) is serializers.ListSerializer and isinstance(field.child, StrictInput):
            child = _compile(field.child)
            if child is not None and not field.validators:
                kind = _LIST
        method = getattr(template, f"validate_{name}", None)
        steps.append((name, field.source_attrs[0], field, kind, child, method))
    validate = None if cls.validate is serializers.Serializer.validate else template.validate
    return steps, frozenset(template.fields), validate


def _run(plan, data):
    steps, known, validate = plan
    if type(data) is not dict or not known.issuperset(data):
        raise _Refused  # not an object, or a key StrictInput refuses
    out = {}
    for name, key, field, kind, child, method in steps:
        value = data.get(name, empty)
        if value is empty:
            if field.required:
                raise _Refused
            with contextlib.suppress(SkipField):  # no default: left out, as DRF does
                default = field.get_default()
                out[key] = default if method is None else method(default)
            continue
        if value is None:
            if not field.allow_null:
                raise _Refused
        elif kind == _FIELD:
            value = field.run_validation(value)
        elif kind == _BOUNDED:
            if type(value) is list and len(value) > field.max_length:
                raise _Refused  # DRF says so, before it validates an item
            value = field.run_validation(value)
        elif kind == _LIST:
            value = _run_list(field, child, value)
        else:
            value = _simple(field, kind, value)
        out[key] = value if method is None else method(value)
    return out if validate is None else validate(out)


def _run_list(field, child, value):
    if type(value) is not list:
        raise _Refused
    if not value and not field.allow_empty:
        raise _Refused
    if field.max_length is not None and len(value) > field.max_length:
        raise _Refused
    if field.min_length is not None and len(value) < field.min_length:
        raise _Refused
    return [_run(child, item) for item in value]


def _simple(field, kind, value):
    kind_of = type(value)
    if kind == _CHAR:
        if kind_of is not str:
            raise _Refused
        if not value:
            if not field.allow_blank:
                raise _Refused
            return ""  # DRF returns a blank before any validator
        if field.trim_whitespace and value.strip() != value:
            raise _Refused
    elif kind == _INT:
        if kind_of is not int:
            raise _Refused
    elif kind == _FLOAT:
        if kind_of is not int and kind_of is not float:
            raise _Refused
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise _Refused
    elif kind == _BOOL:
        if kind_of is not bool:
            raise _Refused
    elif kind == _CHOICE:
        if kind_of is not str or not value:
            raise _Refused
        value = field.choice_strings_to_values[value]
    field.run_validators(value)
    return value
