import base64
import functools

from django.conf import settings
from rest_framework import serializers

from jobs.models import Invocation, Wire, shown_priority
from lakeshore_admin.output import BuiltOnceFields
from lakeshore_admin.strict_input import INT_MAX, StrictInput, name_field, without_nul


class PriorityField(serializers.FloatField):
    """A float (the SDK sends 5.5); a whole number shows as an integer, as it always has."""

    def to_representation(self, value):
        return shown_priority(value)


class InvocationSerializer(BuiltOnceFields, serializers.ModelSerializer):
    """An invocation as every answer shows it (fields built once: lakeshore_admin/output.py)."""

    id = serializers.CharField(read_only=True)
    worker = serializers.SerializerMethodField()
    priority = PriorityField(read_only=True)
    args_bytes = serializers.SerializerMethodField(
        help_text="Size of the SDK's opaque arguments (null for JSON args)"
    )
    result_bytes = serializers.SerializerMethodField(
        help_text="Size of the SDK's opaque result (null for JSON results)"
    )
    retry_of = serializers.SerializerMethodField(
        help_text="The ended invocation this one retries (POST …/retry/), or null"
    )

    class Meta:
        model = Invocation
        fields = [
            "id",
            "queue",
            "function",
            "args",
            "kwargs",
            "priority",
            "wire",
            "state",
            "worker",
            "attempts",
            "max_attempts",
            "timeout_s",
            "key",
            "reason",
            "result",
            "args_bytes",
            "result_bytes",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "retry_of",
        ]

    def get_worker(self, invocation) -> str | None:
        return None if invocation.daemon_id is None else str(invocation.daemon_id)

    def get_retry_of(self, invocation) -> str | None:
        return None if invocation.retry_of_id is None else str(invocation.retry_of_id)

    def get_args_bytes(self, invocation) -> int | None:
        return invocation.blob_size("args_blob")

    def get_result_bytes(self, invocation) -> int | None:
        return invocation.blob_size("result_blob")


class PositionSerializer(serializers.Serializer):
    ahead = serializers.FloatField()
    exact = serializers.BooleanField()
    capped = serializers.BooleanField()


class InvocationDetailSerializer(InvocationSerializer):
    position = PositionSerializer(allow_null=True, read_only=True)
    retried_as = serializers.SerializerMethodField(
        help_text="The invocation that retries this one, or null"
    )

    class Meta(InvocationSerializer.Meta):
        fields = [*InvocationSerializer.Meta.fields, "position", "retried_as"]

    def get_retried_as(self, invocation) -> str | None:
        retry = getattr(invocation, "retried_as", None)
        return None if retry is None else str(retry)


class SubmitInput(StrictInput):
    function = serializers.CharField(max_length=300)
    queue = serializers.CharField(allow_blank=True, allow_null=True, default="")
    args = serializers.ListField(
        child=serializers.JSONField(), default=list, validators=[without_nul]
    )
    kwargs = serializers.DictField(
        child=serializers.JSONField(), default=dict, validators=[without_nul]
    )
    priority = serializers.FloatField(min_value=-1_000_000, max_value=1_000_000, default=0)
    key = serializers.CharField(max_length=200, allow_blank=True, default="")
    timeout_s = serializers.IntegerField(
        min_value=1, max_value=INT_MAX, allow_null=True, default=None
    )
    max_attempts = serializers.IntegerField(min_value=1, max_value=100, default=1)

    def validate_queue(self, value):
        if not value:
            return ""
        return _valid_queue_name(value)


@functools.lru_cache(maxsize=4096)
def _valid_queue_name(value: str) -> str:
    """A queue name checked once per process (a batch names the same few queues
    thousands of times); a bad one raises each time, as exceptions are not cached."""
    return name_field().run_validation(value)


class KillInput(StrictInput):
    reason = serializers.CharField(max_length=500, allow_blank=True, default="")


class BulkCancelInput(StrictInput):
    queue = serializers.CharField(allow_null=True, allow_blank=True, default=None)
    reason = serializers.CharField(max_length=500, allow_blank=True, default="")
    dry_run = serializers.BooleanField(default=False)


class BulkCancelOutput(serializers.Serializer):
    cancelled = serializers.IntegerField()
    dry_run = serializers.BooleanField()
    queue = serializers.CharField(allow_null=True)


class WiresField(serializers.ListField):
    """What a daemon can run: "json" (function + JSON args), and "envelope" (the Python
    SDK's @dls.udf calls, run through the SDK's exec contract: lakeshore/sdk_job.py)."""

    NAMES = {"json": Wire.JSON, "envelope": Wire.ENVELOPE}

    def __init__(self, **kwargs):
        kwargs.setdefault("child", serializers.ChoiceField(choices=list(self.NAMES)))
        kwargs.setdefault("default", lambda: [Wire.JSON])  # as validated: JSON only
        kwargs.setdefault("min_length", 1)
        kwargs.setdefault("help_text", 'What the daemon can run: "json" (default), "envelope"')
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        return [self.NAMES[name] for name in dict.fromkeys(super().to_internal_value(data))]


class ClaimInput(StrictInput):
    limit = serializers.IntegerField(min_value=1, max_value=100, default=1)
    wait = serializers.FloatField(min_value=0, max_value=20, default=0)
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
    state = serializers.ChoiceField(choices=["succeeded", "failed", "timeout"])
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
        max_value=20,
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
