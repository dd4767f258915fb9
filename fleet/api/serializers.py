"""The API's shapes for providers, daemons, the daemon protocol and apply/export."""

import base64

from django.conf import settings
from rest_framework import serializers

from fleet.daemons import current_invocation_id
from fleet.models import Daemon, Provider
from fleet.parked import CLAIM_WAIT_MAX
from fleet.registration import MAX_DAEMON_QUEUES
from fleet.services import provider_status
from jobs import logs
from jobs.api.serializers import InvocationSerializer
from jobs.models import REPORTED_STATES, Wire
from lakeshore_admin.output import BuiltOnceFields
from lakeshore_admin.strict_input import INT_MAX, StrictInput, name_field, without_nul
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
    heartbeat_timeout = serializers.SerializerMethodField(
        help_text="Seconds of silence after which the server marks this daemon lost "
        "(LAKESHORE_HEARTBEAT_TIMEOUT): the daemon renews well within it."
    )

    def get_heartbeat_timeout(self, daemon) -> float:
        return float(settings.LAKESHORE_HEARTBEAT_TIMEOUT)

    class Meta(DaemonSerializer.Meta):
        fields = [*DaemonSerializer.Meta.fields, "token", "heartbeat_timeout"]


class ProviderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Provider
        fields = ["name", "kind", "description", "config", "created_at", "updated_at"]


class ProviderDetailSerializer(ProviderSerializer):
    status = serializers.SerializerMethodField(
        help_text="What the provider runs, never asked of it for this answer. slurm: what "
        "the controller's tick last observed (reachable, error, partitions from sinfo, its "
        "live jobs from squeue) and observed_at (null, with reachable null: not yet); "
        "local: its processes."
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
    queues = serializers.ListField(
        child=name_field(), allow_empty=True, default=list, max_length=MAX_DAEMON_QUEUES
    )
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


# Providers, and queues, one lakeshore.yaml may list: each list's length is checked before
# any of its items is validated (a list of 190,000 bad items cost 396 MiB: issue 29).
DECLARED_MAX = 10_000


class DeclaredDocument(StrictInput):
    """lakeshore.yaml: the providers and queues it declares, with the API's field names."""

    providers = DeclaredProvider(many=True, required=False, max_length=DECLARED_MAX)
    queues = DeclaredQueue(many=True, required=False, max_length=DECLARED_MAX)


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


class ApplyRefusal(serializers.Serializer):
    code = serializers.CharField(help_text="the service's error code (`queue_in_use`)")
    message = serializers.CharField()


class ApplyItem(serializers.Serializer):
    type = serializers.ChoiceField(choices=["provider", "queue"])
    name = serializers.CharField()
    action = serializers.ChoiceField(choices=["create", "update", "unchanged", "delete"])
    changes = serializers.DictField(
        child=ApplyChange(),
        help_text="by field path (`elasticity.max`): old and new values; on create every "
        "field's new value, on delete every field's old one",
    )
    refused = ApplyRefusal(
        allow_null=True,
        help_text="why this removal is refused, as `rm` would refuse it; null when it is "
        "not. Only in a 409 `apply_refused` answer's `error.items`",
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


class WiresField(serializers.ListField):
    """What a daemon can run: "json" (function + JSON args), and "envelope" (the Python
    SDK's @dls.udf calls, run through the SDK's exec contract: lakeshore/sdk_job.py)."""

    NAMES = {"json": Wire.JSON, "envelope": Wire.ENVELOPE}
    MAX = 16  # names in the list: each wire once, a repeat is dropped

    def __init__(self, **kwargs):
        kwargs.setdefault("child", serializers.ChoiceField(choices=list(self.NAMES)))
        kwargs.setdefault("default", lambda: [Wire.JSON])  # as validated: JSON only
        kwargs.setdefault("min_length", 1)
        kwargs.setdefault("max_length", self.MAX)
        kwargs.setdefault("help_text", 'What the daemon can run: "json" (default), "envelope"')
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        return [self.NAMES[name] for name in dict.fromkeys(super().to_internal_value(data))]


class ClaimInput(StrictInput):
    limit = serializers.IntegerField(min_value=1, max_value=100, default=1)
    wait = serializers.FloatField(min_value=0, max_value=CLAIM_WAIT_MAX, default=0)
    wires = WiresField()


class ClaimedSerializer(InvocationSerializer):
    """A claimed invocation as the daemon gets it: with the SDK's argument bytes."""

    args_blob = serializers.SerializerMethodField(
        help_text="base64 of the Python SDK's msgpack envelope (wire envelope), else null"
    )

    class Meta(InvocationSerializer.Meta):
        fields = [*InvocationSerializer.Meta.fields, "args_blob"]

    def get_args_blob(self, invocation) -> str | None:
        blob = invocation.args_blob
        return None if blob is None else base64.b64encode(bytes(blob)).decode()


class CompleteInput(StrictInput):
    invocation = serializers.IntegerField(min_value=1, max_value=2**63 - 1)
    attempt = serializers.IntegerField(min_value=1, max_value=INT_MAX)
    state = serializers.ChoiceField(choices=[str(state) for state in REPORTED_STATES])
    result = serializers.JSONField(
        required=False, allow_null=True, default=None, validators=[without_nul]
    )
    error = serializers.CharField(allow_blank=True, default="", max_length=100_000)
    result_blob = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        help_text="base64 of a Python SDK invocation's result (msgpack), for succeeded",
    )
    retry = serializers.BooleanField(
        default=True, help_text="false: a failure is final even with attempts left"
    )

    def validate_result_blob(self, value):
        if value is None:
            return None
        try:
            blob = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise serializers.ValidationError("not base64") from None
        limit = settings.LAKESHORE_SDK_MAX_BLOB_BYTES
        if len(blob) > limit:
            raise serializers.ValidationError(f"{len(blob):,} bytes: the limit is {limit:,}")
        return blob

    def validate_error(self, value):
        return value.replace("\x00", "\\x00")  # keep the traceback, drop what PG can't store


class LogChunkInput(StrictInput):
    invocation = serializers.IntegerField(min_value=1, max_value=2**63 - 1)
    attempt = serializers.IntegerField(min_value=1, max_value=INT_MAX)
    seq = serializers.IntegerField(
        min_value=0, max_value=2**63 - 1, help_text="the daemon's own number, per attempt"
    )
    dropped = serializers.IntegerField(
        min_value=0, max_value=2**63 - 1, default=0, help_text="lines lost before these"
    )
    lines = serializers.JSONField(
        help_text=f"1 to {logs.CHUNK_MAX_LINES:,} lines, each [stream ('o' or 'e'), epoch "
        f"seconds, text of at most {logs.LINE_MAX_BYTES:,} bytes, no newline]"
    )

    def validate(self, attrs):
        where = f"invocation {attrs['invocation']} attempt {attrs['attempt']} seq {attrs['seq']}"
        attrs["lines"] = logs.checked_lines(attrs["lines"], where)
        return attrs


class LogShipInput(StrictInput):
    chunks = LogChunkInput(many=True, max_length=logs.CHUNKS_MAX, allow_empty=False)


class LogShipped(serializers.Serializer):
    invocation = serializers.IntegerField()
    attempt = serializers.IntegerField()
    seq = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["stored", "duplicate", "stale"])


class HeartbeatInput(StrictInput):
    held = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        allow_null=True,
        default=None,
        max_length=10_000,
        help_text="Ids of every invocation the daemon holds (running, or finished and not "
        "yet reported). Running ones of this daemon missing from it for longer than the "
        "claim grace go back to the queue: their claim's answer never arrived.",
    )
    drain = serializers.BooleanField(
        default=False,
        help_text="The daemon is stopping (its first SIGTERM): it is set draining, and its "
        "waiting claim answers at once, saying so.",
    )


class DaemonCommandOutput(serializers.Serializer):
    id = serializers.CharField()
    verb = serializers.ChoiceField(choices=["kill", "signal"])
    signal = serializers.ChoiceField(choices=["TERM", "INT", "KILL"])
    invocation = serializers.CharField()
    by = serializers.CharField(help_text="Who asked, and through what.")


class HeartbeatOutput(serializers.Serializer):
    state = serializers.CharField()
    running = serializers.ListField(child=serializers.CharField())
    commands = DaemonCommandOutput(
        many=True, help_text="Operators' orders for this daemon (daemon exec), each sent once."
    )


class ExecInput(StrictInput):
    verb = serializers.ChoiceField(choices=["kill", "signal"])
    job = serializers.IntegerField(min_value=1, max_value=INT_MAX, help_text="The invocation.")
    signal = serializers.ChoiceField(
        choices=["TERM", "INT", "KILL"],
        required=False,
        allow_null=True,
        default=None,
        help_text="For `signal`: TERM, INT or KILL (KILL follows a grace if it lives on).",
    )

    def validate(self, attrs):
        if attrs["verb"] == "signal" and not attrs.get("signal"):
            raise serializers.ValidationError({"signal": "required with verb signal"})
        if attrs["verb"] == "kill" and attrs.get("signal") not in (None, "KILL"):
            raise serializers.ValidationError({"signal": "kill always sends KILL"})
        return attrs


class ExecOutput(serializers.Serializer):
    command = serializers.CharField()
    daemon = serializers.CharField()
    invocation = serializers.CharField()
    verb = serializers.CharField()
    signal = serializers.CharField()
    state = serializers.CharField(help_text="The invocation's state now: killed.")
    reason = serializers.CharField()


class CommandDoneInput(StrictInput):
    result = serializers.CharField(max_length=500, allow_blank=True)


class CommandDoneOutput(serializers.Serializer):
    id = serializers.CharField()
    result = serializers.CharField()
    done_at = serializers.DateTimeField()


EXCHANGE_OUTCOMES_MAX = 1_000  # as many as a batch completion takes


class ExchangeInput(StrictInput):
    outcomes = CompleteInput(
        many=True,
        required=False,
        default=list,
        max_length=EXCHANGE_OUTCOMES_MAX,
        help_text="Outcomes to record first, as POST …/complete/ takes them in a list "
        "(each fenced alone); none: only a claim.",
    )
    limit = serializers.IntegerField(
        min_value=0, max_value=100, default=1, help_text="Invocations to claim (0: none)."
    )
    wait = serializers.FloatField(
        min_value=0,
        max_value=CLAIM_WAIT_MAX,
        default=0,
        help_text="Seconds an empty claim waits for work (after the outcomes are recorded).",
    )
    wires = WiresField()


class OutcomeAnswer(serializers.Serializer):
    """One outcome's answer, as a batch completion gives it."""

    invocation = serializers.CharField()
    ok = serializers.BooleanField()
    state = serializers.CharField(required=False, help_text="When recorded: the state now.")
    error = serializers.DictField(
        required=False, help_text="When refused: code (claim_stale, …), message, state."
    )


class ExchangeOutput(serializers.Serializer):
    recorded = OutcomeAnswer(many=True)
    claimed = ClaimedSerializer(many=True)
