import functools

from rest_framework import serializers

from jobs import logs
from jobs.models import (
    RETRYABLE_STATES,
    SEARCH_MAX_LENGTH,
    SEARCH_MIN_LENGTH,
    Invocation,
    shown_priority,
)
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


class SubmittedSerializer(InvocationSerializer):
    """A submit's answer: the invocation, and what its user should know about its queue."""

    hint = serializers.SerializerMethodField(
        help_text="Set when no live daemon serves the queue and no provider starts one: "
        "what to run to start one ('' otherwise)"
    )

    created = serializers.BooleanField(
        read_only=True,
        help_text="False when its idempotency key answered an invocation queued before "
        "(or earlier in the same batch)",
    )

    class Meta(InvocationSerializer.Meta):
        fields = [*InvocationSerializer.Meta.fields, "hint", "created"]

    def get_hint(self, invocation) -> str:
        return getattr(invocation, "hint", "")


class PositionSerializer(serializers.Serializer):
    ahead = serializers.FloatField()
    exact = serializers.BooleanField()
    capped = serializers.BooleanField()


class InvocationDetailSerializer(InvocationSerializer):
    position = PositionSerializer(allow_null=True, read_only=True)
    retried_as = serializers.SerializerMethodField(
        help_text="The invocation that retries this one, or null"
    )

    discarded_outcome = serializers.SerializerMethodField(
        help_text="Set on a job killed while it ran that had finished its work before the "
        "kill reached its daemon: the outcome the daemon then reported (succeeded, failed, "
        "timeout), discarded, as the job stays killed; null otherwise"
    )
    discarded_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="When that discarded report reached the server, or null",
    )

    class Meta(InvocationSerializer.Meta):
        fields = [
            *InvocationSerializer.Meta.fields,
            "position",
            "retried_as",
            "discarded_outcome",
            "discarded_at",
        ]

    def get_retried_as(self, invocation) -> str | None:
        retry = getattr(invocation, "retried_as", None)
        return None if retry is None else str(retry)

    def get_discarded_outcome(self, invocation) -> str | None:
        return invocation.discarded_outcome or None


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


def search_field():
    return serializers.CharField(
        min_length=SEARCH_MIN_LENGTH,
        max_length=SEARCH_MAX_LENGTH,
        allow_blank=True,  # no search
        default="",
        help_text="Text in the function, the key or the error's headline (any case)",
    )


def since_field(what: str):
    return serializers.CharField(
        max_length=40,
        allow_blank=True,  # no time
        default="",
        help_text=f"Only those {what} since: a span back from now (30m, 1h, 7d) or an ISO time",
    )


class BulkCancelInput(StrictInput):
    queue = serializers.CharField(allow_null=True, allow_blank=True, default=None)
    search = search_field()
    since = since_field("submitted")
    reason = serializers.CharField(max_length=500, allow_blank=True, default="")
    dry_run = serializers.BooleanField(default=False)


class BulkCancelOutput(serializers.Serializer):
    cancelled = serializers.IntegerField()
    dry_run = serializers.BooleanField()
    queue = serializers.CharField(allow_null=True)


class BulkRetryInput(StrictInput):
    state = serializers.ListField(
        child=serializers.ChoiceField(choices=[str(s) for s in RETRYABLE_STATES]),
        min_length=1,
        max_length=len(RETRYABLE_STATES),
        help_text="The ended states to retry: failed, timeout, killed",
    )
    queue = serializers.CharField(allow_null=True, allow_blank=True, default=None)
    search = search_field()
    since = since_field("that ended")
    dry_run = serializers.BooleanField(default=False)


class BulkRetryOutput(serializers.Serializer):
    matched = serializers.IntegerField(help_text="What the filter takes (a dry run: all of it)")
    retried = serializers.IntegerField()
    dry_run = serializers.BooleanField()
    filter = serializers.CharField(help_text="The filter, as the audit event names it")


class LogQuery(StrictInput):
    """GET /api/v1/jobs/<id>/logs/: which lines."""

    attempt = serializers.IntegerField(min_value=1, max_value=INT_MAX, required=False)
    offset = serializers.IntegerField(min_value=0, max_value=2**62, default=0)
    limit = serializers.IntegerField(
        min_value=1, max_value=logs.READ_MAX_LINES, default=logs.READ_DEFAULT_LINES
    )
    tail = serializers.IntegerField(
        min_value=0, max_value=logs.READ_MAX_LINES, required=False, help_text="the last N lines"
    )
    stream = serializers.ChoiceField(choices=sorted(logs.STREAM_LETTERS), required=False)
    since = serializers.DateTimeField(required=False, help_text="lines read at or after it")
    follow = serializers.BooleanField(
        default=False, help_text="no new line yet: wait for one, or for the attempt to end"
    )
    wait = serializers.FloatField(min_value=0, max_value=logs.FOLLOW_MAX_SECONDS, default=20)


class LogLine(serializers.Serializer):
    n = serializers.IntegerField(help_text="line number in the attempt's log, from 0")
    at = serializers.DateTimeField(allow_null=True, help_text="when the daemon read it")
    stream = serializers.ChoiceField(
        choices=[*sorted(logs.STREAM_LETTERS), logs.CUT, logs.DROPPED],
        help_text="out or err; cut and dropped are the server's marker lines",
    )
    text = serializers.CharField()


class LogCut(serializers.Serializer):
    lines = serializers.IntegerField()
    bytes = serializers.IntegerField()


class LogPage(serializers.Serializer):
    invocation = serializers.CharField()
    attempt = serializers.IntegerField()
    attempts = serializers.IntegerField()
    state = serializers.CharField()
    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField(help_text="ask from here for what follows")
    lines = LogLine(many=True)
    total_lines = serializers.IntegerField()
    cut = LogCut(allow_null=True)
    dropped_lines = serializers.IntegerField()
    finished = serializers.BooleanField(help_text="the attempt is over: no new line will come")
    complete = serializers.BooleanField(help_text="finished, and every line was read")


class SdkSetup(serializers.Serializer):
    url_path = serializers.CharField(help_text="Where the SDK's routes start: /v1/.")
    namespace = serializers.CharField(
        help_text="The SDK's one namespace here (LAKESHORE_SDK_NAMESPACE): its LAKESHORE_NAMESPACE."
    )
    user = serializers.CharField(help_text="The caller's user, who owns a token made for it.")
    roles = serializers.ListField(
        child=serializers.CharField(),
        help_text="What the caller's token may do (submitting from the SDK needs operator).",
    )


# ---------------------------------------------------------------------------- insight


class SpreadSerializer(serializers.Serializer):
    p50 = serializers.IntegerField(allow_null=True)
    p95 = serializers.IntegerField(allow_null=True)
    max = serializers.IntegerField(allow_null=True)


class PerMinuteSerializer(serializers.Serializer):
    succeeded = serializers.FloatField()
    failed = serializers.FloatField()
    killed = serializers.FloatField()
    timeout = serializers.FloatField()


class TopErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="The error in one line (a traceback's last line)")
    count = serializers.IntegerField()
    last_job = serializers.CharField(help_text="The newest invocation that had it")


class EndedSerializer(serializers.Serializer):
    """What ended in a window (jobs/insight.py)."""

    window = serializers.CharField()
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    killed = serializers.IntegerField()
    timeout = serializers.IntegerField()
    per_minute = PerMinuteSerializer()
    wait_ms = SpreadSerializer(help_text="Submitted → started, in milliseconds")
    run_ms = SpreadSerializer(help_text="Started → finished, in milliseconds")
    timed = serializers.IntegerField(help_text="How many finishes the timings are of")
    errors = TopErrorSerializer(many=True)
