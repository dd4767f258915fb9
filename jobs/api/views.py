"""Jobs (invocations) and the daemon protocol. Thin views over jobs/services.py."""

import copy

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import heavy
from jobs import logs, search, services
from jobs.api import serializers as s
from jobs.api.long_poll import LongPollView
from jobs.filters import InvocationFilter
from jobs.models import Invocation, InvocationState
from lakeshore_admin.api_docs import errors
from lakeshore_admin.lean_input import validated
from lakeshore_admin.pagination import (
    MAX_OFFSET,
    bounded_int,
    filtered,
    list_response,
    next_link,
)


class JobList(APIView):
    @extend_schema(
        summary="List invocations, newest first",
        parameters=[
            OpenApiParameter("limit", int, description="1–200, default 50"),
            OpenApiParameter("offset", int, description="rows to skip, ≥ 0 (default 0)"),
            OpenApiParameter(
                "state",
                str,
                many=True,
                enum=InvocationState.values,
            ),
            OpenApiParameter("daemon", str, description="daemon id"),
            OpenApiParameter("worker", str, description="daemon id: the same as `daemon`"),
            OpenApiParameter("queue", str, description="queue name"),
            OpenApiParameter(
                "cursor", int, description="keyset: only ids below this (from the Link header)"
            ),
            OpenApiParameter(
                "search",
                str,
                description="3–200 characters found in the function, the key or the error's "
                "headline (any case); a search too broad to read in time is refused with "
                "search_too_broad",
            ),
            OpenApiParameter("since", str, description="submitted at or after (ISO 8601)"),
            OpenApiParameter("until", str, description="submitted before (ISO 8601)"),
        ],
        responses={200: s.InvocationSerializer(many=True), **errors(400)},
    )
    def get(self, request):
        limit = bounded_int(request, "limit", default=50, low=1, high=200)
        offset = bounded_int(request, "offset", default=0, low=0, high=MAX_OFFSET)
        queryset = filtered(InvocationFilter, request, Invocation.objects.light().order_by("-id"))
        text = request.query_params.get("search")
        if text:  # valid by now, as the cursor is
            cursor = request.query_params.get("cursor")
            with search.bounded(text):
                rows = search.newest(
                    queryset, offset + limit + 1, below=int(cursor) if cursor else None
                )[offset:]
        else:
            rows = list(queryset[offset : offset + limit + 1])
        link = None
        if len(rows) > limit:  # the next page by keyset: fast at any depth
            link = next_link(request, drop=("offset",), limit=limit, cursor=rows[limit - 1].pk)
        return list_response(rows[:limit], link, s.InvocationSerializer)

    @extend_schema(
        summary="Submit one invocation (an object) or a batch (a list of up to 10,000)",
        request=s.SubmitInput,
        responses={
            201: s.SubmittedSerializer,
            200: s.SubmittedSerializer,
            **errors(400, 404, 409, 429),
        },
    )
    def post(self, request):
        return Response(*submit_answer(request, request.data))


# The daemon protocol's and submit's answers: (payload, status) from the request's
# user and its parsed body. The DRF views below serve them, and so does the lean path
# (edge/lean_path.py) that skips the middleware and DRF's dispatch for them.
# A claim's and an exchange's add their headers (Retry-After when a long-poll was
# refused a slot: jobs/waits.py).


def submit_answer(request, data):
    if isinstance(data, list):
        limit = services.BATCH_SUBMIT_MAX
        if not data or len(data) > limit:
            raise ValidationError({"__all__": f"a batch holds 1 to {limit:,} invocations."})
        results = services.invocation_submit_batch(validated(s.SubmitInput, data, many=True))
        created = any(made for _, made in results)
        payload = s.SubmittedSerializer(_answered(results), many=True).data
    else:
        invocation, created = services.invocation_submit(**validated(s.SubmitInput, data))
        payload = s.SubmittedSerializer(_answered([(invocation, created)])[0]).data
    return payload, status.HTTP_201_CREATED if created else status.HTTP_200_OK


def _answered(results: list[tuple[Invocation, bool]]) -> list[Invocation]:
    """The invocations a submit answers, each carrying its `created`. A key repeated in
    a batch answers one invocation twice, made then found: the second answer is a copy,
    so that each says its own."""
    answered, seen = [], set()
    for invocation, created in results:
        if id(invocation) in seen:
            invocation = copy.copy(invocation)
        seen.add(id(invocation))
        invocation.created = created
        answered.append(invocation)
    return answered


class JobDetail(APIView):
    @extend_schema(
        summary="One invocation; a queued one shows its position in its queue",
        responses={200: s.InvocationDetailSerializer, **errors(404)},
    )
    def get(self, request, invocation_id):
        invocation = services.invocation_get(invocation_id)
        invocation.position = services.queue_position(invocation)
        invocation.retried_as = services.retried_as(invocation)
        return Response(s.InvocationDetailSerializer(invocation).data)


class JobLogs(LongPollView):
    @extend_schema(
        summary="What an attempt printed (the latest by default), from line `offset` on",
        description="Lines carry their stream (out, err), the time the daemon read them and "
        "their number in the attempt's log; `next_offset` is where to ask next. With "
        "`follow`, a read that finds no new line waits (up to `wait` s) for one or for the "
        "attempt to end (`finished`). A log past LAKESHORE_LOG_MAX_BYTES keeps its head and "
        "its tail, with a `cut` marker line between them.",
        parameters=[s.LogQuery],
        responses={200: s.LogPage, **errors(400, 404)},
    )
    def get(self, request, invocation_id):
        query = s.LogQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        steps = logs.read_steps(invocation_id, **query.validated_data)
        return self.long_poll(request, steps, lambda page: Response(s.LogPage(page).data))


class JobKill(APIView):
    @extend_schema(
        summary="Kill a queued invocation (running or finished ones answer 409)",
        request=s.KillInput,
        responses={200: s.InvocationSerializer, **errors(400, 404, 409)},
    )
    def post(self, request, invocation_id):
        data = s.KillInput(data=request.data or {})
        data.is_valid(raise_exception=True)
        invocation = services.invocation_kill(invocation_id=invocation_id, **data.validated_data)
        return Response(s.InvocationSerializer(invocation).data)


class JobRetry(APIView):
    @extend_schema(
        summary="Retry an ended invocation (failed, timeout, killed) as a new one linked "
        "to it; once per invocation (409 already_retried names the retry)",
        request=None,
        responses={201: s.InvocationSerializer, **errors(404, 409, 429)},
    )
    def post(self, request, invocation_id):
        invocation = services.invocation_retry(invocation_id=invocation_id)
        return Response(s.InvocationSerializer(invocation).data, status=status.HTTP_201_CREATED)


class JobBulkCancel(APIView):
    @extend_schema(
        summary="Cancel every queued invocation (of one queue, holding a text, submitted "
        "since a time); running work is untouched",
        request=s.BulkCancelInput,
        responses={200: s.BulkCancelOutput, **errors(400, 404, 429)},
    )
    def post(self, request):
        data = s.BulkCancelInput(data=request.data or {})
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        with heavy.requests.one_of(request.user):
            count = services.invocation_bulk_cancel(**fields)
        return Response(
            {"cancelled": count, "dry_run": fields["dry_run"], "queue": fields["queue"]}
        )


class JobBulkRetry(APIView):
    @extend_schema(
        summary="Retry every ended invocation of these states (of one queue, holding a text, "
        "ended since a time) not retried yet, each as a new invocation linked to it",
        request=s.BulkRetryInput,
        responses={200: s.BulkRetryOutput, **errors(400, 404, 409, 429)},
    )
    def post(self, request):
        data = s.BulkRetryInput(data=request.data or {})
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        with heavy.requests.one_of(request.user):
            answer = services.invocation_bulk_retry(states=fields.pop("state"), **fields)
        return Response(s.BulkRetryOutput(answer).data)


# ---------------------------------------------------------------------------- daemon protocol
