"""Output serializers whose fields are built once per class. An output serializer of a
fixed shape (read-only, no per-request context in its fields) builds and binds its
fields on its first instance; later instances read the same ones, and threads may share
them, since only to_representation runs on them (never for input serializers:
validation keeps state). Their to_representation walks a plan made once from those
fields (each field's name, the attribute it reads, its own to_representation), as
DRF's loop does without its generic lookups per field and row; a field with a dotted
source keeps DRF's own way. Why: docs/decisions/0004-the-hot-statements.md."""

import threading

from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject

_lock = threading.Lock()


class BuiltOnceFields:
    """Mix into a read-only output serializer (before the DRF base class)."""

    @property
    def fields(self):
        cls = type(self)
        built = cls.__dict__.get("_fields_built_once")
        if built is None:
            with _lock:
                built = cls.__dict__.get("_fields_built_once")
                if built is None:
                    built = super().fields
                    cls._fields_built_once = built
        return built

    def _plan(self):
        cls = type(self)
        plan = cls.__dict__.get("_representation_plan")
        if plan is None:
            plan = []
            for name, field in self.fields.items():
                if field.write_only:
                    continue
                if field.source == "*":
                    plan.append((name, None, field.to_representation, None))
                elif len(field.source_attrs) == 1:
                    plan.append((name, field.source_attrs[0], field.to_representation, None))
                else:
                    plan.append((name, None, None, field))
            cls._representation_plan = plan
        return plan

    def to_representation(self, instance):
        out = {}
        for name, attr, convert, field in self._plan():
            if attr is None and field is None:
                out[name] = convert(instance)
                continue
            if field is None:
                try:
                    value = getattr(instance, attr)
                except AttributeError:  # a default, or a field that skips: DRF decides
                    field = self.fields[name]
                else:
                    out[name] = None if value is None else convert(value)
                    continue
            try:  # DRF's way: a dotted source, or an attribute that is missing
                value = field.get_attribute(instance)
            except SkipField:
                continue
            check = value.pk if isinstance(value, PKOnlyObject) else value
            out[name] = None if check is None else field.to_representation(value)
        return out
