import hashlib
import secrets

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "lsk_"  # noqa: S105 (a label, not a secret)


def hash_token(raw: str) -> str:
    # A 256-bit random secret needs no slow hash: SHA-256 makes a leaked table useless.
    return hashlib.sha256(raw.encode()).hexdigest()


class Role(models.TextChoices):
    VIEWER = "viewer", "viewer (read)"
    OPERATOR = "operator", "operator (read and act)"
    DAEMON = "daemon", "daemon (daemon protocol only)"


class ApiTokenQuerySet(models.QuerySet):
    def usable(self, now=None):
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the secret is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise a token.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    role = models.CharField(
        max_length=16,
        choices=Role.choices,
        help_text="What this token may do, never more than its user may (accounts/roles.py).",
    )
    queues = ArrayField(
        models.CharField(max_length=63),
        null=True,
        blank=True,
        help_text="A daemon token scoped to queues registers daemons on these only; "
        "empty (null) means any queue.",
    )
    bound = models.BooleanField(
        default=False,
        help_text="A daemon's own credential: it acts only for the daemon whose token it "
        "is (fleet.Daemon.token), and registers no other daemon.",
    )

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def is_usable(self) -> bool:
        return self.revoked_at is None and (
            self.expires_at is None or self.expires_at > timezone.now()
        )

    @classmethod
    def issue(
        cls,
        *,
        user,
        role: str,
        name: str = "",
        expires_at=None,
        queues: list[str] | None = None,
        bound: bool = False,
    ) -> tuple["ApiToken", str]:
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user,
            name=name,
            prefix=raw[:12],
            digest=hash_token(raw),
            expires_at=expires_at,
            role=role,
            queues=queues,
            bound=bound,
        )
        return token, raw

    def allows_queues(self, names: list[str]) -> bool:
        """Whether a daemon may serve `names` with this token ([] is the default
        queue, which has no name: a scoped token may not serve it)."""
        if self.queues is None:
            return True
        return bool(names) and set(names) <= set(self.queues)

    def revoke(self) -> None:
        ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        self.refresh_from_db(fields=["revoked_at"])


class AuditEvent(models.Model):
    """One operator action (accounts/audit.py records it from the services): who, by
    which door, what, on which queue or object. Kept for LAKESHORE_RETENTION_DAYS."""

    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150, help_text="User name; 'system' for no request.")
    via = models.CharField(max_length=10, help_text="api, cli, console, admin or system")
    action = models.CharField(max_length=40, help_text="e.g. queue.pause, job.retry")
    queue = models.CharField(max_length=63, blank=True, help_text="The queue it concerns.")
    target = models.CharField(max_length=100, blank=True, help_text="e.g. 'job 12'")
    summary = models.CharField(max_length=500, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["-at", "-id"], name="audit_at"),
            models.Index(fields=["queue", "-at", "-id"], name="audit_queue_at"),
            models.Index(fields=["target", "at"], name="audit_target_at"),  # a job's page
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"
