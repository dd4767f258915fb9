"""Output serializers whose fields are built once per class.

DRF builds a ModelSerializer's fields on every instance: it maps each model field to a
serializer field and deep-copies the declared ones, about a millisecond per response
for an invocation. An output serializer of a fixed shape (read-only, no per-request
context in its fields) can build them once: the first instance builds and binds them,
later instances read the same ones. Only reading happens on them (to_representation),
so threads may share them. Not for input serializers: validation keeps state."""

import threading

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
