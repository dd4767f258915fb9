"""The API's shapes for providers, daemons and apply/export."""

from rest_framework import serializers

from fleet.daemons import current_invocation_id
from fleet.models import Daemon, Provider
from fleet.services import provider_status
from lakeshore_admin.output import BuiltOnceFields
from lakeshore_admin.strict_input import StrictInput, name_field, without_nul
from queues.api.serializers import QueueInput, QueueSerializer

_UNREAD = object()


class DaemonSerializer(BuiltOnceFields, serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    provider = serializers.SlugRelatedField(slug_field="name", read_only=True)
    current_invocation = serializers.SerializerMethodField()

    class Meta:
        model = Daemon
        fields = [
            "id",
            "name",
            "queues",
            "state",
            "provider",
            "instance_type",
            "external_id",
            "log_path",
            "current_invocation",
            "last_heartbeat_at",
            "created_at",
        ]

    def get_current_invocation(self, daemon) -> str | None:
        """The newest invocation it runs: annotated by Daemon.objects.for_list(), or
        read here for a daemon loaded otherwise."""
        pk = getattr(daemon, "current_invocation_id", _UNREAD)
        if pk is _UNREAD:
            pk = current_invocation_id(daemon.pk)
        return None if pk is None else str(pk)


class RegisteredDaemonSerializer(DaemonSerializer):
    token = serializers.CharField(
        source="credential",
        read_only=True,
        allow_null=True,
        help_text="The daemon's own credential, shown once: it speaks the daemon protocol "
        "for this daemon only. Null when the token that registered is already this "
        "daemon's own (a daemon a provider started).",
    )

    class Meta(DaemonSerializer.Meta):
        fields = [*DaemonSerializer.Meta.fields, "token"]


class ProviderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Provider
        fields = ["name", "kind", "description", "config", "created_at", "updated_at"]


class ProviderDetailSerializer(ProviderSerializer):
    status = serializers.SerializerMethodField(
        help_text="What the provider runs now, asked of it for this answer (slurm: "
        "reachable, error, partitions from sinfo, and its live jobs from squeue; local: "
        "its processes)."
    )

    class Meta(ProviderSerializer.Meta):
        fields = [*ProviderSerializer.Meta.fields, "status"]

    def get_status(self, provider) -> dict:

        return provider_status(provider)


class ProviderInput(StrictInput):
    name = name_field()
    kind = serializers.ChoiceField(choices=Provider.Kind.choices)
    description = serializers.CharField(max_length=500, allow_blank=True, default="")
    config = serializers.JSONField(default=dict, validators=[without_nul])


class ProviderPatch(StrictInput):
    name = serializers.CharField(required=False)
    kind = serializers.CharField(required=False)
    description = serializers.CharField(max_length=500, allow_blank=True, required=False)
    config = serializers.JSONField(required=False, validators=[without_nul])


class DaemonRegister(StrictInput):
    name = serializers.CharField(max_length=200)
    queues = serializers.ListField(child=name_field(), allow_empty=True, default=list)
    provider = serializers.CharField(allow_blank=True, allow_null=True, default=None)
    instance_type = serializers.CharField(max_length=100, allow_blank=True, default="")


class Declared:
    """An item of lakeshore.yaml keeps only the fields the file gives: a field missing
    from the file is not managed by it (left alone on update, its default on create)."""

    def to_internal_value(self, data):
        values = super().to_internal_value(data)
        return {key: value for key, value in values.items() if key in data}


class DeclaredProvider(Declared, ProviderInput):
    pass


class DeclaredQueue(Declared, QueueInput):
    pass


class DeclaredDocument(StrictInput):
    """lakeshore.yaml: the providers and queues it declares, with the API's field names."""

    providers = DeclaredProvider(many=True, required=False)
    queues = DeclaredQueue(many=True, required=False)


class ApplyInput(StrictInput):
    document = DeclaredDocument()
    dry_run = serializers.BooleanField(
        default=False, help_text="plan only: say what would change, change nothing"
    )
    prune = serializers.BooleanField(
        default=False,
        help_text="also remove the queues and providers the document does not declare",
    )


def document_paths(errors: dict) -> dict[str, str]:
    """ApplyInput's errors, one message per path of the document itself
    (`queues[1].elasticity.kind`, not `document.queues.1.elasticity.kind`): the CLI
    maps these paths to lines of the file."""
    flat: dict[str, str] = {}

    def walk(detail, path: str) -> None:
        if isinstance(detail, dict):
            for key, inner in detail.items():
                if isinstance(key, int):  # DRF keys a list's errors by index
                    walk(inner, f"{path}[{key}]")
                elif key == "non_field_errors":
                    walk(inner, path)
                else:
                    walk(inner, f"{path}.{key}" if path else str(key))
        elif isinstance(detail, list) and any(isinstance(i, dict | list) for i in detail):
            for index, inner in enumerate(detail):
                walk(inner, f"{path}[{index}]")
        else:
            messages = detail if isinstance(detail, list) else [detail]
            flat[path or "__all__"] = " ".join(str(message) for message in messages)

    walk(errors, "")
    return {
        (path.removeprefix("document.") if path != "document" else path): message
        for path, message in flat.items()
    }


class ApplyChange(serializers.Serializer):
    old = serializers.JSONField(allow_null=True)
    new = serializers.JSONField(allow_null=True)


class ApplyItem(serializers.Serializer):
    type = serializers.ChoiceField(choices=["provider", "queue"])
    name = serializers.CharField()
    action = serializers.ChoiceField(choices=["create", "update", "unchanged", "delete"])
    changes = serializers.DictField(
        child=ApplyChange(),
        help_text="by field path (`elasticity.max`): old and new values; on create every "
        "field's new value, on delete every field's old one",
    )


class ApplyResult(serializers.Serializer):
    applied = serializers.BooleanField(help_text="this call changed something")
    up_to_date = serializers.BooleanField(help_text="every item is unchanged")
    dry_run = serializers.BooleanField()
    items = ApplyItem(many=True)


class QueueDetailSerializer(QueueSerializer):
    daemons = DaemonSerializer(many=True, read_only=True, source="member_daemons")

    class Meta(QueueSerializer.Meta):
        fields = [*QueueSerializer.Meta.fields, "daemons"]
