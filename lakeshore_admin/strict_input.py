"""What the API's input serializers share: they refuse keys they do not know (a
misspelt field is an error, never ignored), NUL characters (PostgreSQL stores none),
integers past PostgreSQL's, and names that break the naming rule."""

from rest_framework import serializers

from lakeshore_admin.names import NAME_MAX_LENGTH, NAME_PATTERN


class StrictInput(serializers.Serializer):
    """Refuses keys it does not know: a misspelt field is an error, never ignored."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {key: f"unknown field (known: {', '.join(self.fields)})" for key in unknown}
                )
        return super().to_internal_value(data)


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
