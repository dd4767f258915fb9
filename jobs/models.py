from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.db import models
from django.db.models import Q
from django.db.models.functions import Cast, Length, Upper
from django.urls import reverse


class InvocationState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    TIMEOUT = "timeout"


class Wire(models.TextChoices):
    """How an invocation's arguments travel. JSON: `function` with `args`/`kwargs`
    (the REST API, the CLI). The others come from the Python SDK (dreamlake-lakeshore)
    and are opaque bytes the server never decodes beyond the function's name."""

    JSON = "", "json"
    ENVELOPE = "envelope", "SDK envelope (@dls.udf, thunk)"
    VALUE = "value", "SDK plain value (SyncQueue.submit)"


SDK_WIRES = [Wire.ENVELOPE, Wire.VALUE]


def shown_priority(value) -> int | float:
    """A priority as people read it (the API, the CLI, the console): 5, not 5.0; the
    SDK's 5.5 stays 5.5."""
    value = float(value)
    return int(value) if value.is_integer() else value


# The rules of the job state machine, one home each. The state changes themselves are
# conditional statements in jobs/transitions/ (the state they start from is in their
# WHERE clause); these sets say the same for code that reads a row (the services'
# refusals, the console's buttons), and tests/jobs/test_transitions.py holds the two
# together: for every state, a predicate is true exactly where its transition is allowed.

# Ended: no transition leaves these states.
TERMINAL_STATES = [
    InvocationState.SUCCEEDED,
    InvocationState.FAILED,
    InvocationState.KILLED,
    InvocationState.TIMEOUT,
]
# Not ended yet: the invocation (and its page) still changes.
ACTIVE_STATES = [InvocationState.QUEUED, InvocationState.RUNNING]
# `jobs kill` (services.invocation_kill, transitions.kill.kill_queued): only while it waits.
KILLABLE_STATES = [InvocationState.QUEUED]
# `daemon exec kill` (fleet.orders.daemon_exec, transitions.kill.kill_running): while it runs.
STOPPABLE_STATES = [InvocationState.RUNNING]
# What a daemon may report of an attempt it ran (transitions.complete).
REPORTED_STATES = [InvocationState.SUCCEEDED, InvocationState.FAILED, InvocationState.TIMEOUT]
# `jobs retry` (services.invocation_retry): ended badly; the retry is a new invocation.
RETRYABLE_STATES = [InvocationState.FAILED, InvocationState.TIMEOUT, InvocationState.KILLED]


ERROR_HEADLINE_MAX_LENGTH = 200


class ErrorHeadline(models.Func):
    """What an error says in one line, as the database computes it for `error_headline`:
    the exception line of a Python traceback (its last line), else the first line that
    is not blank, cut to ERROR_HEADLINE_MAX_LENGTH characters. Every traceback starts
    with the same first line, so its last one is the line that tells errors apart."""

    template = (
        "left(CASE WHEN starts_with(%(expressions)s, 'Traceback (most recent call last):')"
        " THEN substring(rtrim(%(expressions)s, E' \\t\\r\\n') from '([^\\n]*)$')"
        " ELSE substring(ltrim(%(expressions)s, E' \\t\\r\\n') from '^([^\\n]*)') END, "
        f"{ERROR_HEADLINE_MAX_LENGTH})"
    )
    output_field = models.CharField(max_length=ERROR_HEADLINE_MAX_LENGTH)


SEARCH_MIN_LENGTH = 3  # a trigram index finds nothing shorter: it would read every row
SEARCH_MAX_LENGTH = 200


class SearchText(models.Func):
    """What `jobs list --search` reads: the function, the key and the error's headline,
    one text, matched by its trigram index (inv_search)."""

    template = "(%(expressions)s)"
    arg_joiner = " || ' ' || "
    output_field = models.TextField()

    def __init__(self):
        super().__init__(models.F("function"), models.F("key"), models.F("error_headline"))


class InvocationQuerySet(models.QuerySet):
    def matching(self, text: str):
        """Those whose function, key or error headline holds `text`, in any case (through
        inv_search; `text` of SEARCH_MIN_LENGTH characters or more)."""
        return self.alias(search_text=Upper(Cast(SearchText(), models.TextField()))).filter(
            search_text__contains=Upper(models.Value(text))
        )

    def light(self):
        """Rows for lists: the SDK's blobs (up to LAKESHORE_SDK_MAX_BLOB_BYTES each)
        stay in the database; their sizes come along instead."""
        return self.defer("args_blob", "result_blob").annotate(
            args_size=Length("args_blob"), result_size=Length("result_blob")
        )


class Invocation(models.Model):
    """One job. `queue` is the queue's name as it was at submit ('' = the default
    queue), so history survives the queue's removal."""

    queue = models.CharField(max_length=63, blank=True, default="")
    function = models.CharField(max_length=300)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    priority = models.FloatField(default=0)
    state = models.CharField(
        max_length=16, choices=InvocationState.choices, default=InvocationState.QUEUED
    )
    daemon = models.ForeignKey(
        "fleet.Daemon",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="invocations",
        # inv_daemon_id (daemon, -id) serves every lookup by daemon: a second index on
        # the same column would only cost every insert, claim and completion a write
        db_index=False,
    )
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    key = models.CharField(max_length=200, blank=True, default="")
    reason = models.CharField(max_length=500, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    error_headline = models.GeneratedField(
        expression=ErrorHeadline("error"),
        output_field=models.CharField(max_length=ERROR_HEADLINE_MAX_LENGTH),
        db_persist=True,
        help_text="The error in one line (jobs.models.ErrorHeadline): what stats group by.",
    )
    # Database defaults too: statements that insert rows by SQL need not name them.
    wire = models.CharField(
        max_length=16, choices=Wire.choices, blank=True, default="", db_default=""
    )
    args_blob = models.BinaryField(
        null=True, blank=True, help_text="The SDK's opaque arguments (msgpack), never decoded."
    )
    result_blob = models.BinaryField(
        null=True, blank=True, help_text="The SDK's opaque result (msgpack), as acked."
    )
    run_config = models.JSONField(
        default=dict,
        db_default=models.Value({}, output_field=models.JSONField()),
        blank=True,
        help_text="The SDK's run_config, stored as it was sent.",
    )
    retry_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="retries",
        db_index=False,  # a partial index below: most rows are no retry
        # No constraint in the database: retention deletes old rows by SQL, and a retry
        # keeps naming the invocation it retried after that one is pruned.
        db_constraint=False,
        help_text="The ended invocation this one retries (jobs retry: a new invocation).",
    )
    scheduled_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A retry waits until then (back-off after a failed attempt).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A kill that races a finishing job (jobs/transitions/completion.py,
    # record_discarded_outcome): the job stays killed, and what its daemon said is kept.
    discarded_outcome = models.CharField(
        max_length=16,
        choices=[(str(state), state.label) for state in REPORTED_STATES],
        blank=True,
        default="",
        db_default="",
        help_text="The outcome its daemon reported after the job was killed while it ran "
        "(the job had finished its work before the kill reached the daemon): refused, as a "
        "killed job stays killed, and kept here. Empty when no such report came.",
    )
    discarded_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When the report of the discarded outcome reached the server.",
    )

    objects = InvocationQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            # claim orders, over queued rows only
            models.Index(
                fields=["queue", "id"],
                name="inv_queued_fifo",
                condition=Q(state=InvocationState.QUEUED),
            ),
            models.Index(
                fields=["queue", "-priority", "id"],
                name="inv_queued_priority",
                condition=Q(state=InvocationState.QUEUED),
            ),
            # lists, newest first, by each filter
            models.Index(fields=["state", "-id"], name="inv_state_id"),
            models.Index(fields=["queue", "-id"], name="inv_queue_id"),
            # Rows that never reached a daemon (queued, killed while queued: most of a
            # bulk-cancel) have none and are not in it: a lookup by daemon names one.
            models.Index(
                fields=["daemon", "-id"],
                name="inv_daemon_id",
                condition=Q(daemon__isnull=False),
            ),
            # what each daemon runs now (heartbeat, orphan rescue, busy/idle)
            models.Index(
                fields=["daemon"],
                name="inv_running_daemon",
                condition=Q(state=InvocationState.RUNNING),
            ),
            models.Index(
                fields=["retry_of"], name="inv_retry_of", condition=Q(retry_of__isnull=False)
            ),
            # what each queue finished lately (its pace, for an ETA); not
            # what was killed, so a bulk-cancel writes no entry here
            models.Index(
                fields=["queue", "finished_at"],
                name="inv_finished",
                condition=Q(finished_at__isnull=False) & ~Q(state=InvocationState.KILLED),
            ),
            # what ended in a window, killed too (stats: counts by queue and state, the
            # newest finishes for the timings), read from the index alone for counts
            models.Index(
                fields=["finished_at"],
                include=["queue", "state"],
                name="inv_ended",
                condition=Q(finished_at__isnull=False),
            ),
            # --search: a substring of the function, the key or the error's headline
            GinIndex(
                OpClass(Upper(Cast(SearchText(), models.TextField())), name="gin_trgm_ops"),
                name="inv_search",
            ),
            # what failed in a window, by error (stats: the top errors)
            models.Index(
                fields=["finished_at"],
                include=["queue", "error_headline", "id"],
                name="inv_failures",
                condition=Q(state__in=[InvocationState.FAILED, InvocationState.TIMEOUT]),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "key"],
                condition=~Q(key=""),
                name="inv_unique_queue_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pk} {self.function} [{self.state}]"

    def get_absolute_url(self) -> str:
        """Its console page (Django admin links to it as "View on site")."""

        return reverse("jobs:detail", args=[self.pk])

    @property
    def is_finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def is_succeeded(self) -> bool:
        return self.state == InvocationState.SUCCEEDED

    @property
    def finished_before_kill(self) -> bool:
        """Whether it was killed while it ran, yet had finished its work before the kill
        reached its daemon: the daemon's report came after the kill and was discarded."""
        return bool(self.discarded_outcome)

    @property
    def can_kill(self) -> bool:
        """Whether `jobs kill` takes it (a running one is stopped on its daemon)."""
        return self.state in KILLABLE_STATES

    @property
    def can_stop(self) -> bool:
        """Whether `daemon exec kill` on its daemon takes it."""
        return self.state in STOPPABLE_STATES and self.daemon_id is not None

    @property
    def can_retry(self) -> bool:
        """Whether it ended so that `jobs retry` may queue it again (once: a second
        retry is refused, see services.retried_as)."""
        return self.state in RETRYABLE_STATES

    @property
    def priority_shown(self) -> int | float:
        return shown_priority(self.priority)

    def blob_size(self, name: str) -> int | None:
        """Bytes in `args_blob` or `result_blob`: from light() without loading it."""
        if name in self.get_deferred_fields():
            return getattr(self, name.replace("_blob", "_size"), None)
        blob = getattr(self, name)
        return None if blob is None else len(blob)


class ResultFrame(models.Model):
    """The SDK's result journal: frames a worker posts while it runs (generator
    yields, the END or ERROR frame), read back by `stream()`. Keyed by the SDK's
    invocation id as a string, which may also be a topic's name: no foreign key. An
    invocation's frames are kept per attempt (a retry writes its own stream, from seq 0
    again; a reader is shown the latest attempt's); a topic's attempt is 0 (TOPIC). The
    first write of a (stream, attempt, seq) wins; frames are bytes the server never
    decodes."""

    stream = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField(default=0, db_default=0)
    seq = models.BigIntegerField()
    data = models.BinaryField()
    final = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["stream", "attempt", "seq"], name="frame_unique_stream_attempt_seq"
            )
        ]
        indexes = [models.Index(fields=["created_at"], name="frame_created")]

    def __str__(self) -> str:
        return f"{self.stream}@{self.attempt}#{self.seq}"


TOPIC = 0  # the attempt of a topic's stream (a stream that names no invocation)


class ResultStream(models.Model):
    """What one result stream (an invocation's attempt, or a topic) holds so far, kept as
    its frames are written (jobs/sdk.py), so that LAKESHORE_SDK_STREAM_MAX_FRAMES and
    _MAX_BYTES are checked in the statement that writes a frame, without counting the
    stream's rows. `writer_token_id`: the credential that wrote its first frame; a topic
    takes frames from that credential only. Swept with the frames (jobs/retention.py)."""

    stream = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField(default=0, db_default=0)
    writer_token_id = models.BigIntegerField(null=True, blank=True)
    frames = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["stream", "attempt"], name="stream_unique_attempt")
        ]
        indexes = [models.Index(fields=["updated_at"], name="stream_updated")]

    def __str__(self) -> str:
        return f"{self.stream}@{self.attempt}: {self.frames} frames, {self.bytes} bytes"


class TopicWriter(models.Model):
    """What the topics one credential (an API token) wrote hold together, kept as their
    frames are written: at most LAKESHORE_SDK_STREAM_MAX_FRAMES frames and
    LAKESHORE_SDK_TOPIC_BYTES_PER_CREDENTIAL bytes, however many topics. A topic's
    totals leave it when retention sweeps the topic's stream (jobs/retention.py)."""

    token_id = models.BigIntegerField(unique=True)
    frames = models.BigIntegerField(default=0)
    bytes = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"token {self.token_id}: topics of {self.frames} frames, {self.bytes} bytes"


class JobLog(models.Model):
    """One attempt's log, as its daemon ships it (jobs/logs.py): the totals, and what
    LAKESHORE_LOG_MAX_BYTES and LAKESHORE_LOG_MAX_ROWS cut. Its lines are in LogChunk
    rows. Lines are numbered from 0 per attempt; numbers stay put when the middle is cut
    (the head and the tail are kept). No database foreign key: swept with its invocation
    (jobs/retention.py)."""

    invocation = models.ForeignKey(
        Invocation, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    attempt = models.PositiveIntegerField()
    lines = models.BigIntegerField(default=0)  # every line shipped, kept or cut
    bytes = models.BigIntegerField(default=0)
    head_bytes = models.BigIntegerField(default=0)  # kept from the start
    tail_bytes = models.BigIntegerField(default=0)  # kept since the head filled
    head_lines = models.BigIntegerField(null=True, blank=True)  # where the head ended
    head_rows = models.BigIntegerField(default=0, db_default=0)  # LogChunk rows of each part
    tail_rows = models.BigIntegerField(default=0, db_default=0)
    # the LogChunk row the next lines may be joined to (jobs/logs.py), if still there
    last_row = models.BigIntegerField(null=True, blank=True)
    cut_lines = models.BigIntegerField(default=0)
    cut_bytes = models.BigIntegerField(default=0)
    dropped_lines = models.BigIntegerField(default=0)  # lost on the daemon (its buffer)
    next_seq = models.BigIntegerField(default=0)  # the daemon's next chunk number
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["invocation", "attempt"], name="joblog_attempt")
        ]

    def __str__(self) -> str:
        return f"log of {self.invocation_id} attempt {self.attempt}: {self.lines} lines"


class LogChunk(models.Model):
    """Lines of one attempt's log, in the order the daemon read them: `streams` has one
    letter a line (o: stdout, e: stderr), `times` the time each was read, `text` the
    lines joined by newlines. `dropped` lines were lost on the daemon just before."""

    invocation = models.ForeignKey(
        Invocation, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    attempt = models.PositiveIntegerField()
    first_line = models.BigIntegerField()
    count = models.PositiveIntegerField()
    bytes = models.PositiveIntegerField()
    streams = models.TextField()
    times = ArrayField(models.FloatField())
    text = models.TextField()
    dropped = models.BigIntegerField(default=0)
    in_head = models.BooleanField(default=True)

    class Meta:
        indexes = [
            models.Index(fields=["invocation", "attempt", "first_line"], name="logchunk_line")
        ]

    def __str__(self) -> str:
        return f"{self.invocation_id}#{self.attempt} lines {self.first_line}+{self.count}"
