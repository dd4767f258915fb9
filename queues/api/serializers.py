from rest_framework import serializers

from jobs.api.serializers import EndedSerializer
from lakeshore_admin.strict_input import INT_MAX, StrictInput, name_field
from queues import elasticity
from queues.models import (
    ElasticityKind,
    OnFull,
    Queue,
    QueueEvent,
    QueueKind,
)


class ElasticityKindField(serializers.ChoiceField):
    def __init__(self, **kwargs):
        super().__init__(choices=ElasticityKind.choices, **kwargs)

    def to_internal_value(self, data):
        message = elasticity.wrong_spelling_message(str(data))
        if message:
            raise serializers.ValidationError(message)
        return super().to_internal_value(data)


class ElasticityInput(StrictInput):
    kind = ElasticityKindField()
    min = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=INT_MAX)
    max = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=INT_MAX)
    threshold = serializers.FloatField(required=False, allow_null=True)


class ElasticityPatch(StrictInput):
    kind = serializers.CharField(required=False)  # refused by the service, with a reason
    min = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=INT_MAX)
    max = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=INT_MAX)
    threshold = serializers.FloatField(required=False, allow_null=True)


class QueueInput(StrictInput):
    name = name_field()
    kind = serializers.ChoiceField(choices=QueueKind.choices, default=QueueKind.FIFO)
    description = serializers.CharField(max_length=500, allow_blank=True, default="")
    provider = serializers.CharField(allow_blank=True, allow_null=True, default=None)
    elasticity = ElasticityInput(required=False, allow_null=True)
    instance_type = serializers.CharField(max_length=100, allow_blank=True, default="")
    image_id = serializers.CharField(max_length=200, allow_blank=True, default="")
    runner = serializers.CharField(max_length=200, allow_blank=True, default="")
    max_depth = serializers.IntegerField(
        min_value=1, max_value=INT_MAX, allow_null=True, default=None
    )
    on_full = serializers.ChoiceField(choices=OnFull.choices, default=OnFull.REJECT)
    temperature = serializers.FloatField(default=1.0)

    def validate_temperature(self, value):
        if not value > 0:
            raise serializers.ValidationError("temperature must be greater than 0.")
        return value


class QueuePatch(StrictInput):
    name = serializers.CharField(required=False)  # refused by the service, with a reason
    kind = serializers.CharField(required=False)
    state = serializers.CharField(required=False)
    description = serializers.CharField(max_length=500, allow_blank=True, required=False)
    provider = serializers.CharField(allow_blank=True, allow_null=True, required=False)
    elasticity = ElasticityPatch(required=False)
    instance_type = serializers.CharField(max_length=100, allow_blank=True, required=False)
    image_id = serializers.CharField(max_length=200, allow_blank=True, required=False)
    runner = serializers.CharField(max_length=200, allow_blank=True, required=False)
    max_depth = serializers.IntegerField(
        min_value=1, max_value=INT_MAX, allow_null=True, required=False
    )
    on_full = serializers.ChoiceField(choices=OnFull.choices, required=False)
    temperature = serializers.FloatField(required=False)

    def validate_temperature(self, value):
        if not value > 0:
            raise serializers.ValidationError("temperature must be greater than 0.")
        return value


class ElasticityOutput(serializers.Serializer):
    kind = serializers.CharField()
    min = serializers.IntegerField(allow_null=True)
    max = serializers.IntegerField(allow_null=True)
    threshold = serializers.FloatField(allow_null=True)


class QueueSerializer(serializers.ModelSerializer):
    provider = serializers.SlugRelatedField(slug_field="name", read_only=True)
    members = serializers.IntegerField(read_only=True)
    elasticity = ElasticityOutput(read_only=True, allow_null=True)

    class Meta:
        model = Queue
        fields = [
            "name",
            "kind",
            "description",
            "state",
            "provider",
            "members",
            "elasticity",
            "instance_type",
            "image_id",
            "runner",
            "max_depth",
            "on_full",
            "temperature",
            "created_at",
            "updated_at",
        ]


class QueueDryRunSerializer(QueueSerializer):
    dry_run = serializers.BooleanField(default=True)
    desired = serializers.IntegerField()

    class Meta(QueueSerializer.Meta):
        fields = [*QueueSerializer.Meta.fields, "dry_run", "desired"]


class EventSerializer(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)

    class Meta:
        model = QueueEvent
        fields = [
            "id",
            "at",
            "action",
            "reason",
            "daemons",
            "busy",
            "pending",
            "utilization",
            "desired",
            "delta",
        ]


class LiveFiguresSerializer(serializers.Serializer):
    """What a stats answer says of daemons and work now, and what ended lately."""

    daemons = serializers.IntegerField()
    busy = serializers.IntegerField()
    idle = serializers.IntegerField()
    provisioning = serializers.IntegerField()
    draining = serializers.IntegerField()
    utilization = serializers.FloatField()
    pending = serializers.IntegerField()
    pending_capped = serializers.BooleanField()
    running = serializers.IntegerField()
    last_hour = EndedSerializer(required=False, help_text="What ended in the last hour")
    last_day = EndedSerializer(required=False, help_text="What ended in the last day (window=24h)")


class StatsSerializer(LiveFiguresSerializer):
    queue = serializers.CharField()
    state = serializers.CharField()
    desired = serializers.IntegerField()
    next_action = serializers.CharField()
    recent_actions = EventSerializer(many=True)


class FleetStatsSerializer(LiveFiguresSerializer):
    queues = serializers.IntegerField(help_text="Queues not archived")
    running_capped = serializers.BooleanField()


# ---------------------------------------------------------------------------- lakeshore.yaml
