"""Operators' orders to a daemon about one invocation it runs (`lakeshore daemon exec`):
pending → delivered (with a heartbeat's answer) → done (the daemon says what it did)."""

from django.db import transaction
from django.utils import timezone

from accounts import audit
from fleet import daemons
from fleet.models import Daemon, DaemonCommand
from jobs.models import REPORTED_STATES, Invocation, InvocationState
from jobs.services import invocation_get
from jobs.transitions import kill
from lakeshore_admin.errors import Conflict, Invalid, NotFound

Q_ = InvocationState


EXEC_VERBS = {"kill": ("KILL",), "signal": ("TERM", "INT", "KILL")}


def daemon_exec(*, daemon, verb: str, invocation_id, signal: str | None = None) -> dict:
    """An operator stops one running invocation on its daemon (`lakeshore daemon exec
    DAEMON kill JOB`, `… signal JOB TERM|INT|KILL`, the console's "Stop on daemon").
    Only these verbs exist. The invocation ends `killed` at once, with the reason and
    who asked; the daemon gets the order with its next heartbeat and stops the
    invocation's process group (a TERM or INT that it outlives is followed by KILL after
    a grace); until then, the daemon's heartbeat already tells it the invocation is no
    longer its own."""
    if verb not in EXEC_VERBS:
        raise Invalid(
            f"Unknown verb {verb!r}: use one of {', '.join(EXEC_VERBS)}.",
            fields={"verb": "unknown"},
        )
    signal = "KILL" if verb == "kill" else (signal or "").upper().removeprefix("SIG")
    if signal not in EXEC_VERBS[verb]:
        raise Invalid(
            f"Signal {signal or '(none)'} is not one of {', '.join(EXEC_VERBS[verb])}.",
            fields={"signal": "unknown"},
        )
    daemons.check_live(daemon)
    invocation = invocation_get(invocation_id)
    who, via = audit.actor_and_via()
    order = f"daemon exec {verb}" + (f" {signal}" if verb == "signal" else "")
    reason = f"stopped on daemon {daemon.pk} by {who} ({order})"
    with transaction.atomic():
        killed = kill.kill_running(invocation_id=invocation.pk, daemon_id=daemon.pk, reason=reason)
        if not killed:
            invocation.refresh_from_db()
            _not_running_here(invocation, daemon)
        command = command_add(
            daemon=daemon, invocation=invocation, verb=verb, signal=signal, by=f"{who} ({via})"
        )
        audit.record(
            "daemon.exec",
            queue=invocation.queue,
            target=f"job {invocation.pk}",
            summary=f"{order} on daemon {daemon.pk} ({daemon.name})",
        )
    return {
        "command": str(command.pk),
        "daemon": str(daemon.pk),
        "invocation": str(invocation.pk),
        "verb": verb,
        "signal": signal,
        "state": Q_.KILLED,
        "reason": reason,
    }


def _not_running_here(invocation: Invocation, daemon) -> None:
    if invocation.state == Q_.RUNNING:
        raise Conflict(
            f"Invocation {invocation.pk} runs on daemon {invocation.daemon_id}, not "
            f"{daemon.pk}: 'lakeshore daemon exec {invocation.daemon_id} kill {invocation.pk}'.",
            extra={"state": invocation.state, "worker": str(invocation.daemon_id)},
            code="invocation_elsewhere",
        )
    if invocation.state == Q_.QUEUED:
        hint = f" ('lakeshore jobs kill {invocation.pk}' kills it while it waits)"
    elif invocation.state in REPORTED_STATES:  # its end was recorded first: it keeps it
        hint = "; it ended before the kill came and keeps its outcome"
    else:
        hint = ""
    raise Conflict(
        f"Invocation {invocation.pk} is not running ({invocation.state}): nothing to stop{hint}.",
        extra={"state": invocation.state},
        code="invocation_not_running",
    )


def command_add(*, daemon: Daemon, invocation, verb: str, signal: str, by: str):

    return DaemonCommand.objects.create(
        daemon=daemon, invocation=invocation, verb=verb, signal=signal, requested_by=by[:200]
    )


def command_done(*, daemon: Daemon, command_id, result: str):
    """The daemon did (or could not do) the order: what it says is kept. A repeat of
    the same report changes nothing."""

    command = DaemonCommand.objects.filter(pk=_int_or_none(command_id), daemon=daemon).first()
    if command is None:
        raise NotFound(f"Daemon {daemon.pk} has no command '{command_id}'.")
    DaemonCommand.objects.filter(pk=command.pk, done_at__isnull=True).update(
        done_at=timezone.now(), result=result[:500]
    )
    command.refresh_from_db()
    return command


def _int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
