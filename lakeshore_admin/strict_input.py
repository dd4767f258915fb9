"""The API's input serializers refuse keys they do not know: a misspelt field is an
error, never ignored."""

from rest_framework import serializers


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
