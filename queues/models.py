from django.apps import apps
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import OuterRef, Q, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.urls import reverse

from lakeshore_admin import metrics
from lakeshore_admin.names import DEFAULT_QUEUE_LABEL, NAME_MAX_LENGTH, name_validator


class QueueKind(models.TextChoices):
    FIFO = "fifo"
    PRIORITY = "priority"
    BOLTZMANN = "boltzmann"
    FILO = "filo"


class QueueState(models.TextChoices):
    ACTIVE = "active"
    DRAINING = "draining"
    PAUSED = "paused"
    ARCHIVED = "archived"


ADMITTING_QUEUE_STATES = [QueueState.ACTIVE, QueueState.PAUSED]
DISPATCHING_QUEUE_STATES = [QueueState.ACTIVE, QueueState.DRAINING]


class ElasticityKind(models.TextChoices):
    FIXED = "fixed"
    FULLY_ELASTIC = "fully_elastic"
    POOL_WITH_THRESHOLD = "pool_with_threshold"
    MAX_COUNT = "max_count"


class OnFull(models.TextChoices):
    REJECT = "reject"
    BLOCK = "block"


# "Does a submit to this queue start a daemon?": the controller starts the daemons of a
# queue with a provider and an elasticity declaration that is not archived. One SQL
# condition over a queue's row ({queue}: its table or alias), read where it is needed:
# inside a submit's INSERT (jobs/serving.py) and by the ORM (starting_daemons), so the
# two cannot disagree and the submit keeps its one statement.
STARTS_DAEMONS_SQL = (
    "({queue}.provider_id IS NOT NULL AND {queue}.elasticity_kind <> ''"
    f" AND {{queue}}.state <> '{QueueState.ARCHIVED.value}')"
)


class QueueQuerySet(models.QuerySet):
    def starting_daemons(self):
        """The queues whose daemons the controller starts (STARTS_DAEMONS_SQL). The
        condition names the queues' table: use it on a query of queues, not inside a
        subquery, where the table takes another alias."""
        rule = STARTS_DAEMONS_SQL.format(queue=self.model._meta.db_table)
        starts = RawSQL(rule, [], output_field=models.BooleanField())  # noqa: S611 - constants
        return self.filter(starts)

    def with_members(self):
        """MEMBERS in the same query: live daemons whose `queues` holds the name. (The
        fleet app sits above this one: its model is found by name, as Queue.provider
        names its own.)"""
        members = (
            apps.get_model("fleet", "Daemon")
            .objects.live()
            .filter(
                queues__contains=models.Func(
                    OuterRef("name"),
                    function="ARRAY",
                    template="ARRAY[%(expressions)s]::varchar(63)[]",
                    output_field=ArrayField(models.CharField(max_length=NAME_MAX_LENGTH)),
                )
            )
            .order_by()
            .annotate(n=models.Func(models.F("id"), function="COUNT"))
            .values("n")
        )
        return self.annotate(members=Coalesce(Subquery(members), 0))

    def for_list(self):
        return self.select_related("provider").with_members()


class Queue(models.Model):
    name = models.CharField(max_length=NAME_MAX_LENGTH, unique=True, validators=[name_validator])
    kind = models.CharField(max_length=16, choices=QueueKind.choices, default=QueueKind.FIFO)
    description = models.CharField(max_length=500, blank=True)
    state = models.CharField(max_length=16, choices=QueueState.choices, default=QueueState.ACTIVE)
    provider = models.ForeignKey(
        "fleet.Provider", null=True, blank=True, on_delete=models.PROTECT, related_name="queues"
    )
    elasticity_kind = models.CharField(
        max_length=32, choices=ElasticityKind.choices, blank=True, default=""
    )
    elasticity_min = models.PositiveIntegerField(null=True, blank=True)
    elasticity_max = models.PositiveIntegerField(null=True, blank=True)
    elasticity_threshold = models.FloatField(null=True, blank=True)
    instance_type = models.CharField(max_length=100, blank=True)
    image_id = models.CharField(max_length=200, blank=True)
    runner = models.CharField(max_length=200, blank=True)
    max_depth = models.PositiveIntegerField(null=True, blank=True)
    on_full = models.CharField(max_length=8, choices=OnFull.choices, default=OnFull.REJECT)
    temperature = models.FloatField(default=1.0)
    launch_failures = models.PositiveIntegerField(
        default=0, help_text="Failed launches in a row (the controller backs off)."
    )
    launch_backoff_until = models.DateTimeField(null=True, blank=True)
    # The controller's own bookkeeping (never a form field): ticks that raised, in a
    # row, and until when it skips the queue.
    tick_failures = models.PositiveIntegerField(
        default=0, editable=False, help_text="Controller ticks of this queue that raised, in a row."
    )
    tick_backoff_until = models.DateTimeField(
        null=True, editable=False, help_text="The controller skips this queue until then."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = QueueQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["state", "name"], name="queue_state_name")]
        constraints = [
            models.CheckConstraint(
                condition=Q(temperature__gt=0), name="queue_temperature_positive"
            ),
            models.CheckConstraint(
                condition=Q(elasticity_min__isnull=True)
                | Q(elasticity_max__isnull=True)
                | Q(elasticity_min__lte=models.F("elasticity_max")),
                name="queue_elasticity_min_le_max",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        """Its console page (Django admin: "View on site")."""

        return reverse("console-queue", args=[self.address])

    @property
    def is_default(self) -> bool:
        """The default queue (queues.services.default_queue): it has no row and no name."""
        return not self.name

    @property
    def address(self) -> str:
        """Its name where an address needs one: '(default)' for the default queue."""
        return self.name or DEFAULT_QUEUE_LABEL

    @property
    def elasticity(self) -> dict | None:
        if not self.elasticity_kind:
            return None
        return {
            "kind": self.elasticity_kind,
            "min": self.elasticity_min,
            "max": self.elasticity_max,
            "threshold": self.elasticity_threshold,
        }

    @property
    def elasticity_text(self) -> str:
        """As `queues ls` shows it: `pool-with-threshold 2..16 @0.7`, `fixed 3`, `-`."""
        spec = self.elasticity
        if not spec:
            return "-"
        text = spec["kind"].replace("_", "-")
        low, high = spec["min"], spec["max"]
        if spec["kind"] == ElasticityKind.FIXED:
            return f"{text} {low}"
        text += f" {low if low is not None else 0}..{high if high is not None else 'unbounded'}"
        if spec["threshold"] is not None:
            text += f" @{spec['threshold']:g}"
        return text

    @property
    def admits_submissions(self) -> bool:
        return self.state in ADMITTING_QUEUE_STATES

    @property
    def uses_temperature(self) -> bool:
        return self.kind == QueueKind.BOLTZMANN


class EventAction(models.TextChoices):
    TICK_NOOP = "tick_noop"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    LAUNCH_FAILED = "launch_failed"
    TERMINATE_FAILED = "terminate_failed"
    DAEMON_LOST = "daemon_lost"  # its provider says it is gone (a Slurm job that ended)
    HOLD = "hold"
    TICK_FAILED = "tick_failed"


class QueueEventQuerySet(models.QuerySet):
    def decisions(self):
        """Everything but tick_noop: what `events` shows without --verbose."""
        return self.exclude(action=EventAction.TICK_NOOP)


class QueueEvent(models.Model):
    """One row per controller decision, with the signals it saw."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=False)
    action = models.CharField(max_length=20, choices=EventAction.choices)
    reason = models.CharField(max_length=500)
    daemons = models.PositiveIntegerField()
    busy = models.PositiveIntegerField()
    pending = models.PositiveIntegerField()
    utilization = models.FloatField()
    desired = models.PositiveIntegerField(help_text="The count the controller moved toward.")
    wanted = models.PositiveIntegerField(
        default=0, help_text="What the formula asked for, before the scale-down window."
    )
    delta = models.IntegerField(default=0)

    objects = QueueEventQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["queue", "-at", "-id"], name="event_queue_at"),
            models.Index(
                fields=["queue", "-at", "-id"],
                name="event_queue_decisions",
                condition=~Q(action="tick_noop"),
            ),
            # the timeline across queues (/events/), newest first
            models.Index(
                fields=["-at", "-id"], name="event_decisions_at", condition=~Q(action="tick_noop")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} {self.action} at {self.at:%Y-%m-%d %H:%M:%S}"


class QueueSample(models.Model):
    """A queue's signals at one minute: the console's charts read them (queue None: the
    default queue's). At most one row per queue per minute (`at` is the minute's start),
    written by queues/samples.py on every controller tick and deleted after
    LAKESHORE_RETENTION_DAYS by jobs/retention.py."""

    queue = models.ForeignKey(
        Queue,
        null=True,
        on_delete=models.CASCADE,
        related_name="samples",
        help_text="None: the default queue (it has no row).",
    )
    at = models.DateTimeField(help_text="The minute sampled (seconds and microseconds zero).")
    pending = models.PositiveIntegerField(help_text="P: queued invocations (capped).")
    running = models.PositiveIntegerField(help_text="Running invocations (capped).")
    daemons = models.PositiveIntegerField(help_text="D: live daemons (provisioning, idle, busy).")
    busy = models.PositiveIntegerField(help_text="B: busy daemons.")
    desired = models.PositiveIntegerField(help_text="The count the controller moves toward.")
    utilization = models.FloatField(help_text="U: B / D.")

    class Meta:
        constraints = [
            # one per queue per minute; also the index of a queue's series (its charts)
            # (the default queue's too: its NULLs are not distinct)
            models.UniqueConstraint(
                fields=["queue", "at"], name="queue_sample_minute", nulls_distinct=False
            ),
        ]
        indexes = [models.Index(fields=["at"], name="queue_sample_at")]  # retention, the tick

    def __str__(self) -> str:
        return f"{self.queue_id} at {self.at:%Y-%m-%d %H:%M}"


class MetricTotal(models.Model):
    """One figure of GET /metrics's counters and histograms, the total of every server
    process's counts (lakeshore_admin/metrics.py adds to it, queues/metrics.py reads it).
    A counter is one row (NAME_total); a histogram is a NAME_sum row and one NAME_bucket
    row per bucket hit, labelled le, holding that bucket's observations alone."""

    name = models.CharField(max_length=100, help_text="The sample's name, e.g. …_total.")
    labels = models.JSONField(help_text='The sample\'s labels, e.g. {"queue": "gpu"}.')
    value = models.FloatField(help_text="The total so far; it only grows.")

    class Meta:
        db_table = metrics.TABLE
        constraints = [
            # the key each flush adds to (INSERT … ON CONFLICT (name, labels))
            models.UniqueConstraint(fields=["name", "labels"], name="metric_total_key"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.labels} = {self.value:g}"
