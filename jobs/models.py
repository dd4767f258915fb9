from django.db import models
from django.db.models import Q


class InvocationState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    TIMEOUT = "timeout"


TERMINAL_STATES = [
    InvocationState.SUCCEEDED,
    InvocationState.FAILED,
    InvocationState.KILLED,
    InvocationState.TIMEOUT,
]


class Invocation(models.Model):
    """One job. `queue` is the queue's name as it was at submit ('' = the default
    queue), so history survives the queue's removal."""

    queue = models.CharField(max_length=63, blank=True, default="")
    function = models.CharField(max_length=300)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    priority = models.IntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=InvocationState.choices, default=InvocationState.QUEUED
    )
    daemon = models.ForeignKey(
        "queues.Daemon",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="invocations",
    )
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    key = models.CharField(max_length=200, blank=True, default="")
    reason = models.CharField(max_length=500, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    scheduled_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A retry waits until then (back-off after a failed attempt).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # claim orders, over queued rows only
            models.Index(
                fields=["queue", "id"],
                name="inv_queued_fifo",
                condition=Q(state="queued"),
            ),
            models.Index(
                fields=["queue", "-priority", "id"],
                name="inv_queued_priority",
                condition=Q(state="queued"),
            ),
            # lists, newest first, by each filter
            models.Index(fields=["state", "-id"], name="inv_state_id"),
            models.Index(fields=["queue", "-id"], name="inv_queue_id"),
            models.Index(fields=["daemon", "-id"], name="inv_daemon_id"),
            # what each daemon runs now (heartbeat, orphan rescue, busy/idle)
            models.Index(
                fields=["daemon"], name="inv_running_daemon", condition=Q(state="running")
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
