"""What the API's input serializers share: they refuse keys they do not know (a
misspelt field is an error, never ignored), lists longer than their bound before any
item is validated, NUL characters (PostgreSQL stores none), integers past
PostgreSQL's, and names that break the naming rule."""

from rest_framework import serializers

from lakeshore_admin.names import NAME_MAX_LENGTH, NAME_PATTERN


class StrictInput(serializers.Serializer):
    """Refuses keys it does not know: a misspelt field is an error, never ignored. And
    a list longer than its field's max_length before any of its items is validated."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {key: f"unknown field (known: {', '.join(self.fields)})" for key in unknown}
                )
            too_long = {
                name: message
                for name, field in self.fields.items()
                if (message := list_too_long(field, data.get(name))) is not None
            }
            if too_long:
                raise serializers.ValidationError(too_long)
        return super().to_internal_value(data)


def list_too_long(field, value) -> str | None:
    """DRF's own message when `value` is a list longer than the ListField `field` takes,
    else None. DRF's ListField validates every item before it looks at the length: a
    list of 150,000 bad items made 150,000 errors, hundreds of megabytes, before the
    bound refused it (issue 29). A ListSerializer (many=True) looks first already."""
    if not isinstance(field, serializers.ListField) or field.max_length is None:
        return None
    if not isinstance(value, list) or len(value) <= field.max_length:
        return None
    return field.error_messages["max_length"].format(max_length=field.max_length)


INT_MAX = 2_147_483_647  # PostgreSQL integer columns


def without_nul(value, path: str = ""):
    """PostgreSQL stores no NUL character in text or JSON: refuse it with a clear error."""
    if isinstance(value, str):
        if "\x00" in value:
            raise serializers.ValidationError(
                f"{path or 'value'} holds a NUL character (\\u0000), which cannot be stored."
            )
    elif isinstance(value, dict):
        for key, inner in value.items():
            without_nul(key, path)
            without_nul(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            without_nul(inner, f"{path}[{index}]" if path else f"[{index}]")
    return value


def name_field(**kwargs):
    return serializers.RegexField(
        NAME_PATTERN,
        max_length=NAME_MAX_LENGTH,
        error_messages={
            "invalid": "Use lower-case letters, digits and '-', starting with a letter or "
            "digit (^[a-z0-9][a-z0-9-]*$)."
        },
        **kwargs,
    )
