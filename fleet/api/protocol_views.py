"""The daemon protocol's doors: heartbeat, claim, complete, exchange, deregister, an
operator's exec, and a command's report. The lean path (edge/lean_path.py)
serves the hot ones through the same answer functions."""

import functools

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import recheck_token
from accounts.permissions import DaemonProtocol, Operate
from fleet import daemons, orders, protocol
from fleet.api import serializers as s
from fleet.models import DaemonState
from fleet.registration import check_speaker, check_speaker_before_body
from fleet.services import daemon_get
from jobs import logs, waits
from jobs.api.long_poll import LongPollView
from lakeshore_admin.api_docs import errors
from lakeshore_admin.lean_input import validated

BATCH_MAX = 1000  # outcomes in one batch completion


def heartbeat_answer(request, daemon_id, data):
    daemon = own_daemon(request, daemon_id)
    fields = validated(s.HeartbeatInput, data or {})
    return daemons.daemon_heartbeat(daemon=daemon, **fields), status.HTTP_200_OK


def claim_answer(request, daemon_id, data):
    return waits.drive(claim_answer_steps(request, daemon_id, data))


def claim_answer_steps(request, daemon_id, data):
    """claim_answer as steps (jobs/waits.py): where it waits, it yields."""
    heard = protocol.heard_on_arrival(request.META, daemon_id)  # before its row is read
    daemon = own_daemon(request, daemon_id)
    fields = validated(s.ClaimInput, data or {})
    claimed = yield from protocol.claim_steps(
        daemon=daemon,
        tell_draining=True,
        recheck=_recheck(request),
        heard=heard,
        since=waits.arrived(request),
        **fields,
    )
    return _claimed(claimed), status.HTTP_200_OK, _headers(claimed, daemon)


def complete_answer(request, daemon_id, data):
    daemon = own_daemon(request, daemon_id)
    if isinstance(data, list):
        if not data or len(data) > BATCH_MAX:
            raise ValidationError({"__all__": f"a batch holds 1 to {BATCH_MAX} outcomes."})
        outcomes = validated(s.CompleteInput, data, many=True)
        answers = protocol.invocation_complete_batch(daemon=daemon, outcomes=outcomes)
        return answers, status.HTTP_200_OK
    fields = validated(s.CompleteInput, data)
    invocation = protocol.invocation_complete(
        daemon=daemon,
        invocation_id=fields["invocation"],
        attempt=fields["attempt"],
        outcome=fields["state"],
        result=fields["result"],
        error=fields["error"],
        result_blob=fields["result_blob"],
        retry=fields["retry"],
    )
    return s.InvocationSerializer(invocation).data, status.HTTP_200_OK


def exchange_answer(request, daemon_id, data):
    return waits.drive(exchange_answer_steps(request, daemon_id, data))


def exchange_answer_steps(request, daemon_id, data):
    """exchange_answer as steps (jobs/waits.py): where it waits, it yields."""
    heard = protocol.heard_on_arrival(request.META, daemon_id)  # before its row is read
    daemon = own_daemon(request, daemon_id)
    fields = validated(s.ExchangeInput, data or {})
    answer = yield from protocol.exchange_steps(
        daemon=daemon,
        tell_draining=True,
        recheck=_recheck(request),
        heard=heard,
        since=waits.arrived(request),
        **fields,
    )
    payload = {"recorded": answer["recorded"], "claimed": _claimed(answer["claimed"])}
    return payload, status.HTTP_200_OK, _headers(answer["claimed"], daemon)


def _claimed(claimed) -> list:
    """The claimed invocations as the answer lists them (an idle poll's none: no
    serializer built, on the event loop that answers it)."""
    return s.ClaimedSerializer(claimed, many=True).data if claimed else []


def _recheck(request):
    """A woken long-poll checks its credential again (it may have been revoked while
    the claim waited): it takes no work with a revoked one."""
    token = request.auth
    return None if token is None else functools.partial(recheck_token, token)


def _headers(claimed, daemon) -> dict[str, str]:
    """A claim's headers: Retry-After when its wait was refused, and `draining` when the
    daemon is asked to drain (a daemon that polls needs no heartbeat to learn it:
    lakeshore daemon run reads it)."""
    headers = waits.headers(claimed)
    if daemon.state == DaemonState.DRAINING:
        headers[STATE_HEADER] = DaemonState.DRAINING.value
    return headers


STATE_HEADER = "Lakeshore-Daemon-State"


def _response(outcome) -> Response:
    """The answer of a claim's or an exchange's steps: (payload, status, headers)."""
    payload, code, headers = outcome
    return Response(payload, code, headers=headers)


def own_daemon(request, daemon_id):
    """Only the daemon's own credential speaks for it; operators for any."""
    daemon = daemon_get(daemon_id, with_provider=False)
    return check_speaker(daemon, user=request.user, token=request.auth)


def before_body(request, daemon_id, *, known_only: bool = False) -> bool:
    """What a daemon protocol request is checked for before its body is read: that its
    token may speak for the daemon (403 not_your_daemon, the body unread). The views
    ask before they touch request.data; the lean path before it reads the body
    (`known_only` on its event loop: False when that takes a query)."""
    return check_speaker_before_body(
        daemon_id, user=request.user, token=request.auth, known_only=known_only
    )


class DaemonHeartbeat(APIView):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="The daemon is alive; answers its state and what it should be running",
        request=s.HeartbeatInput,
        responses={200: s.HeartbeatOutput, **errors(400, 404, 409)},
    )
    def post(self, request, daemon_id):
        before_body(request, daemon_id)
        return Response(*heartbeat_answer(request, daemon_id, request.data))


class DaemonLongPoll(LongPollView):
    """A daemon's claim or exchange: it notes the daemon's channel before DRF reads the
    credential (fleet/protocol.hear_on_arrival)."""

    def initial(self, request, *args, **kwargs):
        protocol.hear_on_arrival(request.META, kwargs["daemon_id"])
        super().initial(request, *args, **kwargs)


class DaemonClaim(DaemonLongPoll):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="Claim up to `limit` invocations of the daemon's queues (long-poll `wait` s)",
        request=s.ClaimInput,
        responses={200: s.ClaimedSerializer(many=True), **errors(400, 404, 409)},
    )
    def post(self, request, daemon_id):
        before_body(request, daemon_id)
        steps = claim_answer_steps(request, daemon_id, request.data)
        return self.long_poll(request, steps, _response)


class DaemonComplete(APIView):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="Report an outcome, or a list of up to 1,000 (each fenced by daemon and "
        "attempt: a stale claim gets 409 claim_stale, alone in a list)",
        request=s.CompleteInput,
        responses={
            200: s.InvocationSerializer,
            **errors(400, 404, 409),
        },
    )
    def post(self, request, daemon_id):
        before_body(request, daemon_id)
        return Response(*complete_answer(request, daemon_id, request.data))


class DaemonExchange(DaemonLongPoll):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="Report outcomes (a list of up to 1,000, each fenced as in complete) and "
        "claim up to `limit` more in one request",
        description="The outcomes are recorded first, then the claim runs (long-poll `wait` "
        "s when it finds nothing). A daemon no longer live gets 409 (daemon_terminated, "
        "daemon_lost) and claims nothing; a retry of outcomes already recorded answers them "
        "in `recorded`. Outcomes recorded before a claim that failed stay recorded: retry "
        "the same request.",
        request=s.ExchangeInput,
        responses={200: s.ExchangeOutput, **errors(400, 404, 409)},
    )
    def post(self, request, daemon_id):
        before_body(request, daemon_id)
        steps = exchange_answer_steps(request, daemon_id, request.data)
        return self.long_poll(request, steps, _response)


class DaemonLogs(APIView):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="Ship what jobs printed: chunks of lines of the attempts this daemon holds",
        description="Each chunk is fenced like a completion: stored only while the daemon "
        "holds that invocation's attempt (else `stale`, nothing stored); a chunk whose "
        "`seq` was stored already is a `duplicate` (a shipment sent again stores nothing "
        "twice). An attempt keeps at most LAKESHORE_LOG_MAX_BYTES and LAKESHORE_LOG_MAX_ROWS "
        "(its head and its tail). A shipment with a chunk of an attempt that ended more "
        "than LAKESHORE_LOG_APPEND_GRACE_SECONDS ago is refused whole: 409 log_closed, "
        "`closed` naming those attempts.",
        request=s.LogShipInput,
        responses={200: s.LogShipped(many=True), **errors(400, 403, 404, 409)},
    )
    def post(self, request, daemon_id):
        daemon = own_daemon(request, daemon_id)
        data = s.LogShipInput(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(logs.ship(daemon_id=daemon.pk, chunks=data.validated_data["chunks"]))


class DaemonDeregister(APIView):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="The daemon leaves after finishing its work (SIGTERM)",
        request=None,
        responses={200: None, **errors(404)},
    )
    def post(self, request, daemon_id):
        daemon = own_daemon(request, daemon_id)
        return Response(daemons.daemon_deregister(daemon=daemon))


class DaemonExec(APIView):
    permission_classes = [Operate]

    @extend_schema(
        summary="Stop one running invocation on its daemon (kill, or a signal): operators",
        request=s.ExecInput,
        responses={201: s.ExecOutput, **errors(400, 403, 404, 409)},
    )
    def post(self, request, daemon_id):
        daemon = daemon_get(daemon_id, with_provider=False)
        data = s.ExecInput(data=request.data or {})
        data.is_valid(raise_exception=True)
        answer = orders.daemon_exec(
            daemon=daemon,
            verb=data.validated_data["verb"],
            invocation_id=data.validated_data["job"],
            signal=data.validated_data["signal"],
        )
        return Response(answer, status=status.HTTP_201_CREATED)


class DaemonCommandDone(APIView):
    permission_classes = [DaemonProtocol]

    @extend_schema(
        summary="The daemon reports what it did with an order (daemon exec)",
        request=s.CommandDoneInput,
        responses={200: s.CommandDoneOutput, **errors(400, 404)},
    )
    def post(self, request, daemon_id, command_id):
        daemon = own_daemon(request, daemon_id)
        data = s.CommandDoneInput(data=request.data or {})
        data.is_valid(raise_exception=True)
        command = orders.command_done(
            daemon=daemon, command_id=command_id, result=data.validated_data["result"]
        )
        return Response(
            {"id": str(command.pk), "result": command.result, "done_at": command.done_at}
        )
