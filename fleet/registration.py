"""Registering a daemon, and who may speak for one (issue 17: one daemon, one
credential).

A daemon registers with a token (`lakeshore daemon run`'s, a provider's minted one, or
an SDK worker's polling token) and gets its own credential: a daemon token bound to
it, scoped to its queues, revoked when it ends (fleet/daemons.py). From then on only
that credential, or an operator, speaks the daemon protocol for it (`check_speaker`).
A token scoped to queues registers daemons on those only (`check_scope`). Whether a
token may bring a daemon to life at all, by any route (REST register, an SDK worker's
first poll, a lost one's return), is `admit_registration`'s alone (issue 29, item 8):
a daemon's credential registers no other daemon, and a token that registers holds at
most LAKESHORE_DAEMONS_PER_TOKEN live daemons."""

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from accounts.models import ApiToken
from accounts.roles import can_operate
from accounts.services import credential_issue
from fleet.daemons import check_live, touch
from fleet.models import Daemon, DaemonState
from lakeshore_admin import hooks
from lakeshore_admin.errors import Forbidden, Invalid, QuotaReached
from queues.models import Queue
from queues.services import _provider_for

MAX_DAEMON_QUEUES = 64
NOT_YOUR_DAEMON = "not_your_daemon"
PROVIDER_NOT_YOURS = "provider_not_yours"


def _name_list(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---------------------------------------------------------------------------- admit


def admit_registration(*, token, returning: Daemon | None = None) -> int | None:
    """Whether `token` may bring a daemon to life: a new one (`returning` None), or one
    that was lost coming back (`returning`). Every route asks here. A daemon's own
    credential (bound) brings back its own daemon only, never another (403
    not_your_daemon). The token that registered a daemon holds at most
    LAKESHORE_DAEMONS_PER_TOKEN live ones at once, a returning one counted against the
    token that first registered it (429 daemons_per_token, until one ends). Answers
    the id of that token, the new daemon's `registered_with` (None: a provider's
    daemon, or a session's). Called inside the registration's transaction, which then
    holds that token's row: in share while the count is far from the limit (such
    registrations do not wait for each other), alone near it, so that registrations at
    once with one token count each other there."""
    own = returning is not None and token is not None and returning.token_id == token.pk
    if token is not None and token.bound and not own:
        raise Forbidden(
            "This token is a daemon's own credential: it registers no other daemon. "
            "Register with the token the daemon started with.",
            code=NOT_YOUR_DAEMON,
        )
    if returning is not None:
        registrar = returning.registered_with_id
    else:
        registrar = token.pk if token is not None else None
    if registrar is None:
        return None
    live = Daemon.objects.live().filter(registered_with_id=registrar)
    if returning is not None:
        live = live.exclude(pk=returning.pk)
    limit = settings.LAKESHORE_DAEMONS_PER_TOKEN
    try:
        with transaction.atomic():  # a savepoint: rolled back, it lets the token's row go
            share_registrar(registrar)
            if live.count() + in_flight_bound() <= limit:
                hooks.point("registration.counted")
                return registrar
            raise _NearTheLimit
    except _NearTheLimit:
        pass
    lock_registrar(registrar)
    counted = live.count()
    hooks.point("registration.counted")
    if counted >= limit:
        raise QuotaReached(
            f"The token that registers this daemon already has {limit} live daemons "
            "(LAKESHORE_DAEMONS_PER_TOKEN): one must end first, or use another token.",
            code="daemons_per_token",
        )
    return registrar


class _NearTheLimit(Exception):
    """The token may be near its limit: its registrations are counted one at a time."""


def share_registrar(token_id: int) -> None:
    """Hold the registering token's row in share with the other registrations far from
    its limit (they do not wait for each other), until the registration commits: one
    near the limit (lock_registrar) waits for them all."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM accounts_apitoken WHERE id = %s FOR KEY SHARE", [token_id])


def lock_registrar(token_id: int) -> None:
    """Hold the registering token's row alone until the registration commits: another
    registration with it waits here (or in share_registrar), then counts the daemon
    this one made."""
    ApiToken.objects.select_for_update().filter(pk=token_id).first()


_in_flight_bound: int | None = None


def in_flight_bound() -> int:
    """The most registrations that can be under way at once: each holds a transaction
    on a connection of the database server, which takes at most max_connections. A
    registration that counts this many fewer live daemons than the limit cannot pass
    it, whatever the others under way do: it needs no turn of its own."""
    global _in_flight_bound
    if _in_flight_bound is None:
        with connection.cursor() as cursor:
            cursor.execute("SHOW max_connections")
            _in_flight_bound = int(cursor.fetchone()[0])
    return _in_flight_bound


# ---------------------------------------------------------------------------- register


def daemon_register(
    *,
    owner,
    name: str,
    queues: list[str],
    provider: str | None = None,
    instance_type: str = "",
    token=None,
) -> tuple[Daemon, str | None]:
    """A daemon announces itself and the queues it serves (`[]` = the default queue).
    `token` is the API token it spoke with, which must be scoped to those queues.

    Answers the daemon and its own credential (raw, shown once): a daemon token bound to
    this one daemon, revoked when it ends. A new daemon comes back as made, its
    `current_invocation_id` None: the answer needs no second read of it. The token that
    registered (a bootstrap token) may register more daemons but never acts as them.
    When `token` is already a daemon's own credential (one a provider minted for the
    daemon it launched), it registers only that daemon, and the credential is None: it
    keeps the one it has.
    Either way `admit_registration` decides first."""

    names = _served(queues)
    _check_queues_exist(names)
    check_scope(token, names)
    _check_provider_claim(token, provider)
    with transaction.atomic():
        if token is not None and token.bound:
            return _register_own(token, names), None
        registered_with = admit_registration(token=token)
        credential, raw = credential_issue(user=owner, name=name, queues=names)
        daemon = _create(
            owner=owner,
            name=name,
            names=names,
            provider=_provider_for(provider),
            instance_type=instance_type,
            registered_with=registered_with,
            token=credential,
        )
        daemon.current_invocation_id = None  # a row made just now runs nothing yet
        return daemon, raw


def _check_provider_claim(token, provider: str | None) -> None:
    """A daemon is provider-run only when its provider launched it: only the credential
    that provider minted for it may name it. A bootstrap token, an operator's, or
    another provider's daemon may not (a daemon posing as provider-run would hold up
    the provider's removal, and count among its daemons)."""
    if not provider:
        return
    launched_by = None
    if token is not None and token.bound:
        launched_by = (
            Daemon.objects.filter(token=token, provider__isnull=False)
            .values_list("provider__name", flat=True)
            .first()
        )
    if launched_by != provider:
        raise Forbidden(
            f"Only a daemon that provider {provider!r} launched registers as its daemon: "
            "register without a provider.",
            fields={"provider": "not a provider that launched this daemon"},
            code=PROVIDER_NOT_YOURS,
        )


def _served(queues: list[str]) -> list[str]:
    names = list(dict.fromkeys(queues))  # keep order, drop repeats
    if len(names) > MAX_DAEMON_QUEUES:
        raise Invalid(
            f"A daemon may serve at most {MAX_DAEMON_QUEUES} queues.", fields={"queues": "too many"}
        )
    return names


def check_scope(token, names: list[str]) -> None:
    """A token scoped to queues serves only those (and never the default queue)."""
    if token is None or token.allows_queues(names):
        return
    scope = ", ".join(token.queues)
    wanted = ", ".join(names) if names else "the default queue"
    raise Forbidden(
        f"This token may serve queues {scope} only, not {wanted}.",
        fields={"queues": "not in the token's scope"},
        code="queue_not_in_scope",
    )


def _create(
    *, owner, name, names, provider, registered_with, instance_type="", token=None, earlier=None
):
    return Daemon.objects.create(
        registered_with_id=registered_with,
        name=name,
        queues=names,
        provider=earlier.provider if earlier and earlier.provider_id else provider,
        instance_type=instance_type or (earlier.instance_type if earlier else ""),
        external_id=earlier.external_id if earlier else "",
        log_path=earlier.log_path if earlier else "",
        owner=owner,
        state=DaemonState.IDLE,
        last_heartbeat_at=timezone.now(),
        token=token,
    )


def _register_own(token, names: list[str]) -> Daemon:
    """A daemon's own credential registers its daemon: the row its provider made for it
    (provisioning), or, after the reaper marked it lost, a new row that keeps what its
    provider knows it by (its provider, its job's external id, its log)."""
    now = timezone.now()
    adopted = Daemon.objects.filter(token=token, state=DaemonState.PROVISIONING).update(
        queues=names, state=DaemonState.IDLE, last_heartbeat_at=now, updated_at=now
    )
    earlier = Daemon.objects.filter(token=token).order_by("-id").first()
    if adopted:
        return earlier
    if earlier is None or earlier.state != DaemonState.LOST:
        admit_registration(token=token)  # refuses: a credential registers no new daemon
    return _create(
        owner=earlier.owner,
        name=earlier.name,
        names=names,
        provider=None,
        token=token,
        earlier=earlier,
        registered_with=admit_registration(token=token, returning=earlier),
    )


def check_speaker(daemon: Daemon, *, user, token) -> Daemon:
    """Only the daemon's own credential, or an operator, speaks the daemon protocol for
    it: not the token that registered it, not another daemon's credential."""
    if can_operate(user) or (_is_credential(token) and daemon.token_id == token.pk):
        return daemon
    raise _not_yours(daemon.pk)


def check_speaker_before_body(daemon_id, *, user, token, known_only: bool = False) -> bool:
    """check_speaker's rule for daemon `daemon_id` (the request's path), before the
    request's body is read: a token that may not speak for it is refused (403
    not_your_daemon) with its body unread. A daemon's credential sent 4 × 10 MiB claims
    on another daemon's id, each parsed before the 403: +819 MiB (issue 29). Whether
    the daemon exists is answered after (404), to those who may speak for it.

    True when it may speak. No query for an operator or a token that is no daemon's
    own credential; for a credential, one per daemon in a process's life (_token_of).
    `known_only` (an event loop asks, which makes no query): False when the answer
    needs that query."""
    if can_operate(user):
        return True
    if _is_credential(token):
        token_id = _known_token_of(daemon_id) if known_only else _token_of(daemon_id)
        if token_id is None and known_only:
            return False
        if token_id == token.pk:
            return True
    raise _not_yours(daemon_id)


def _is_credential(token) -> bool:
    """A daemon's own credential: the only token that speaks for a daemon (its own)."""
    return token is not None and token.bound


def _not_yours(daemon_id) -> Forbidden:
    return Forbidden(
        f"This token may act only for its own daemon, not daemon {daemon_id}.",
        code=NOT_YOUR_DAEMON,
    )


# daemon id → its token's id, for the daemons seen: a daemon's token is set in the
# transaction that makes its row and never changes, so what was read stays true. Only
# rows that exist are kept (an id asked before its daemon is made is asked again).
_TOKENS_OF: dict[int, int] = {}
TOKENS_OF_KEPT = 100_000  # then the map starts again: a query per daemon once more


def _known_token_of(daemon_id) -> int | None:
    try:
        return _TOKENS_OF.get(int(daemon_id))
    except (TypeError, ValueError):
        return None


def _token_of(daemon_id) -> int | None:
    if (known := _known_token_of(daemon_id)) is not None:
        return known
    try:
        pk = int(daemon_id)  # the path's: any text (the API's URLs), digits (the lean path's)
    except (TypeError, ValueError):
        return None
    if not 0 < pk < 2**63:
        return None
    token_id = Daemon.objects.filter(pk=pk).values_list("token_id", flat=True).first()
    if token_id is not None:
        if len(_TOKENS_OF) >= TOKENS_OF_KEPT:
            _TOKENS_OF.clear()
        _TOKENS_OF[pk] = token_id
    return token_id


def sdk_worker_seen(*, owner, worker_id: str, queue: str, token=None) -> Daemon:
    """An SDK worker (dreamlake-lakeshore) polled. It never registers: its first poll
    does, as a daemon named by its worker id, serving the polled queue, owned by the
    token's user. Later polls find it (and follow it to another queue). One that was
    presumed dead (lost) and polls again is live again; its old work was handed back.
    One that was dropped gets daemon_terminated, which ends the SDK's worker. A worker
    id belongs to the user who first polled with it."""
    try:
        return _sdk_worker_seen(owner, worker_id, queue, token)
    except IntegrityError:  # two first polls of one worker id at once: the other made it
        return _sdk_worker_seen(owner, worker_id, queue, token)


def _sdk_worker_seen(owner, worker_id: str, queue: str, token) -> Daemon:
    check_scope(token, [queue])
    with transaction.atomic():
        daemon = Daemon.objects.select_for_update().filter(worker_id=worker_id).first()
        if daemon is None:
            hooks.point("sdk_worker.before_create")
            _check_queues_exist([queue])
            registrar = admit_registration(token=token)
            # The token that polls is the worker's: what it claims, only that token acks.
            daemon = _create(
                owner=owner,
                name=worker_id[:200],
                names=[queue],
                provider=None,
                token=token,
                registered_with=registrar,
            )
            Daemon.objects.filter(pk=daemon.pk).update(worker_id=worker_id)
            daemon.worker_id = worker_id
            return daemon
        if not _polls_as(daemon, owner, token):
            raise Forbidden(
                f"Worker id {worker_id!r} belongs to a worker polling with another token.",
                code=NOT_YOUR_DAEMON,
            )
        if daemon.state == DaemonState.TERMINATED:
            check_live(daemon)  # daemon_terminated
        changes = {}
        if daemon.queues != [queue]:
            _check_queues_exist([queue])
            changes["queues"] = [queue]
        if daemon.state == DaemonState.LOST:
            admit_registration(token=token, returning=daemon)
            changes["state"] = DaemonState.IDLE
        if changes:
            changes["last_heartbeat_at"] = changes["updated_at"] = timezone.now()
            Daemon.objects.filter(pk=daemon.pk).update(**changes)
            for field, value in changes.items():
                setattr(daemon, field, value)
    touch(daemon.pk)  # renews the lease on what it runs
    return daemon


def _polls_as(daemon: Daemon, owner, token) -> bool:
    """An SDK worker's row belongs to the token that first polled with its id (rows
    made before tokens were recorded: to that token's user)."""
    if daemon.token_id is not None:
        return token is not None and daemon.token_id == token.pk
    return daemon.owner_id == owner.pk


def _check_queues_exist(names: list[str]) -> None:
    known = set(Queue.objects.filter(name__in=names).values_list("name", flat=True))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise Invalid(
            f"Unknown queue(s): {_name_list(unknown)}. Add them with 'lakeshore queues add'.",
            fields={"queues": f"unknown: {', '.join(unknown[:10])}"},
        )
