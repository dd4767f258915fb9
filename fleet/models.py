"""The fleet's records: providers (what launches daemons), daemons (worker processes
subscribed to queues by name) and operators' orders to daemons. Their tables are
named for this app (fleet_provider, fleet_daemon, fleet_daemoncommand); the SQL of
other apps that reads or writes them takes the name from the model (`_meta.db_table`).
"""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import connection, models
from django.urls import reverse

from jobs.models import Invocation, InvocationState
from lakeshore_admin.names import NAME_MAX_LENGTH, name_validator
from lakeshore_admin.rows import model_rows


class Provider(models.Model):
    """A plug-in that launches and terminates daemons. `config` never holds secrets."""

    class Kind(models.TextChoices):
        LOCAL = "local", "local (processes on this host)"
        SIMULATED = "simulated", "simulated (records only)"
        SLURM = "slurm", "slurm (one batch job per daemon)"

    name = models.CharField(max_length=NAME_MAX_LENGTH, unique=True, validators=[name_validator])
    kind = models.CharField(max_length=32, choices=Kind.choices)
    description = models.CharField(max_length=500, blank=True)
    config = models.JSONField(default=dict, blank=True)
    observed = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the controller's tick last saw of the provider (slurm: its "
        "partitions and jobs, or why it could not ask); reads show this, never ask.",
    )
    observed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DaemonState(models.TextChoices):
    PROVISIONING = "provisioning"
    IDLE = "idle"
    BUSY = "busy"
    DRAINING = "draining"
    TERMINATED = "terminated"
    LOST = "lost"


LIVE_DAEMON_STATES = [
    DaemonState.PROVISIONING,
    DaemonState.IDLE,
    DaemonState.BUSY,
    DaemonState.DRAINING,
]
# Live daemons that may take new work (a draining one finishes what it has, and stops).
CLAIMING_DAEMON_STATES = [DaemonState.PROVISIONING, DaemonState.IDLE, DaemonState.BUSY]


OVERLAP_NAMES_MAX = 64  # subscribed_to_any: up to this many names, the GIN index
_NAMES = ArrayField(models.CharField(max_length=NAME_MAX_LENGTH))


class DaemonQuerySet(models.QuerySet):
    def live(self):
        return self.filter(state__in=LIVE_DAEMON_STATES)

    def subscribed_to(self, queue_name: str):
        return self.filter(queues__contains=[queue_name])

    def subscribed_to_any(self, queue_names: list[str]):
        """Subscribed to any of these queues. For a few names, the array overlap (&&),
        which the GIN index answers; for many, each daemon's names looked up in a
        hashed set: the overlap compares each of a row's names with every name asked,
        and a tick over 10,000 queues would spend seconds on that."""
        if len(queue_names) <= OVERLAP_NAMES_MAX:
            return self.filter(queues__overlap=list(queue_names))
        return self.filter(
            models.Func(  # EXISTS (SELECT 1 FROM unnest(queues) AS n WHERE n = ANY(names))
                models.F("queues"),
                models.Value(list(queue_names), output_field=_NAMES),
                template="EXISTS (SELECT 1 FROM unnest(%(expressions)s))",
                arg_joiner=") AS n WHERE n = ANY(",
                output_field=models.BooleanField(),
            )
        )

    def serving(self, queue_name: str):
        """Daemons that take this queue's work: subscribed to it, or for the default
        queue (''), subscribed to none."""
        return self.filter(queues=[]) if not queue_name else self.subscribed_to(queue_name)

    def for_list(self):
        """With its provider, and `current_invocation_id`: the newest invocation it runs
        (read from the invocations, so the daemon's row is not written on every claim)."""
        running = Invocation.objects.filter(
            daemon_id=models.OuterRef("pk"), state=InvocationState.RUNNING
        ).order_by("-id")
        return self.select_related("provider").annotate(
            current_invocation_id=models.Subquery(running.values("id")[:1])
        )

    def by_pk(self, pk: int):
        """One daemon by id, or None, without compiling a query (lakeshore_admin/rows.py):
        the daemon protocol reads its daemon on every request."""
        if not -(2**63) <= pk < 2**63:
            return None  # no bigint id: none such (the ORM's answer too)
        table = connection.ops.quote_name(self.model._meta.db_table)
        found = model_rows(self.model, f"SELECT * FROM {table} WHERE id = %s", [pk])  # noqa: S608
        return found[0] if found else None


class Daemon(models.Model):
    """A worker process subscribed to queues by name; `queues == []` is the default queue."""

    name = models.CharField(max_length=200)
    queues = ArrayField(models.CharField(max_length=NAME_MAX_LENGTH), default=list, blank=True)
    state = models.CharField(max_length=16, choices=DaemonState.choices, default=DaemonState.IDLE)
    provider = models.ForeignKey(
        Provider, null=True, blank=True, on_delete=models.PROTECT, related_name="daemons"
    )
    instance_type = models.CharField(max_length=100, blank=True)
    external_id = models.CharField(
        max_length=200, blank=True, help_text="The provider's id for this daemon."
    )
    log_path = models.CharField(
        max_length=500,
        blank=True,
        help_text="Where a provider-launched daemon's log goes (on the host that runs it).",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="daemons",
        help_text="The user whose token registered it; only that user (or an operator) "
        "may speak the daemon protocol for it.",
    )
    token = models.ForeignKey(
        "accounts.ApiToken",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The token minted for this daemon by its provider; revoked when it ends.",
    )
    registered_with = models.ForeignKey(
        "accounts.ApiToken",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The token that registered it (a bootstrap daemon token, or the token an "
        "SDK worker first polled with): it may hold LAKESHORE_DAEMONS_PER_TOKEN live "
        "daemons at once. Empty for a provider's daemons, which their provider made.",
    )
    worker_id = models.CharField(
        max_length=200,
        null=True,
        blank=True,
        unique=True,
        help_text="An SDK worker's own id (hostname-ULID): it registered by polling "
        "/v1/daemon/poll, and it sends no heartbeat (a lease keeps its work instead).",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = DaemonQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            GinIndex(fields=["queues"], name="daemon_queues_gin"),
            models.Index(fields=["state", "last_heartbeat_at"], name="daemon_state_heartbeat"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.pk})"

    def get_absolute_url(self) -> str:
        """Its row on the console's daemons page (Django admin: "View on site")."""
        return f"{reverse('fleet:daemons')}?id={self.pk}"

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_DAEMON_STATES


class DaemonCommand(models.Model):
    """An operator's order to a daemon about one invocation it runs (`lakeshore daemon
    exec`): a fixed verb, never a command line. Pending until the daemon's heartbeat
    carries it (delivered), done when the daemon says what it did. fleet/daemons.py
    owns this lifecycle."""

    class Verb(models.TextChoices):
        KILL = "kill", "kill (SIGKILL to the invocation's process group)"
        SIGNAL = "signal", "signal (TERM, INT or KILL; KILL after a grace if it lives on)"

    class Signal(models.TextChoices):
        TERM = "TERM"
        INT = "INT"
        KILL = "KILL"

    daemon = models.ForeignKey(Daemon, on_delete=models.CASCADE, related_name="commands")
    invocation = models.ForeignKey(
        "jobs.Invocation",
        on_delete=models.DO_NOTHING,
        db_constraint=False,  # retention deletes invocations by SQL; the order stays
        related_name="+",
    )
    verb = models.CharField(max_length=16, choices=Verb.choices)
    signal = models.CharField(max_length=8, choices=Signal.choices)
    requested_by = models.CharField(max_length=200, help_text="Who asked, and through what.")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    result = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # what a heartbeat delivers: this daemon's undelivered orders
            models.Index(
                fields=["daemon"],
                name="daemon_command_pending",
                condition=models.Q(delivered_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return f"{self.verb} {self.signal} invocation {self.invocation_id} on {self.daemon_id}"


class Beat(models.Model):
    """When a periodic job last ran, whichever server's Celery beat fired it: two or
    more servers share one database, and the controller's tick runs once an interval
    (fleet/controller.beat_due)."""

    name = models.CharField(primary_key=True, max_length=32)
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} at {self.at:%Y-%m-%d %H:%M:%S}"
