"""Thin views: parse → authorise (permission classes) → call the service → respond."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import QueueDetailSerializer  # a queue shows its daemons
from fleet.models import Daemon
from jobs import insight
from lakeshore_admin.api_docs import errors
from lakeshore_admin.errors import NotFound
from lakeshore_admin.pagination import (
    OFFSET,
    LimitOffset,
    bounded_int,
    filtered,
    list_response,
    next_link,
)
from queues import elasticity, services
from queues.api import serializers as s
from queues.filters import QueueFilter
from queues.models import Queue, QueueEvent, QueueState

MEMBERS_SHOWN = 500


def _queue_read(name: str) -> Queue:
    try:
        return Queue.objects.for_list().get(name=name)
    except Queue.DoesNotExist:
        raise NotFound(f"Queue '{name}' does not exist.") from None


def _truthy(request, name: str) -> bool:
    return request.query_params.get(name, "").lower() in ("1", "true", "yes")


class QueueList(APIView):
    pages = LimitOffset(default=100, maximum=1000)

    @extend_schema(
        summary="List queues (archived ones only with state=archived)",
        parameters=[
            OpenApiParameter("state", str, enum=QueueState.values),
            OpenApiParameter("limit", int, description="1–1000, default 100"),
            OFFSET,
        ],
        responses={200: s.QueueSerializer(many=True), **errors(400)},
    )
    def get(self, request):
        queryset = filtered(QueueFilter, request, Queue.objects.for_list())
        rows, link = self.pages.paginate(queryset, request)
        return list_response(rows, link, s.QueueSerializer)

    @extend_schema(
        summary="Add a queue",
        request=s.QueueInput,
        responses={201: s.QueueSerializer, **errors(400, 409)},
    )
    def post(self, request):
        data = s.QueueInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        queue = services.queue_create(elasticity_spec=fields.pop("elasticity", None), **fields)
        return Response(
            s.QueueSerializer(_queue_read(queue.name)).data, status=status.HTTP_201_CREATED
        )


class QueueDetail(APIView):
    @extend_schema(
        summary="One queue and its member daemons",
        responses={200: QueueDetailSerializer, **errors(404)},
    )
    def get(self, request, name):
        queue = _queue_read(name)
        queue.member_daemons = list(
            Daemon.objects.live().subscribed_to(name).for_list().order_by("id")[:MEMBERS_SHOWN]
        )
        return Response(QueueDetailSerializer(queue).data)

    @extend_schema(
        summary="Change a queue in place (not its name, kind or elasticity kind)",
        request=s.QueuePatch,
        parameters=[
            OpenApiParameter(
                "dry_run", bool, description="show the result and desired count; save nothing"
            )
        ],
        responses={200: s.QueueSerializer, **errors(400, 404)},
    )
    def patch(self, request, name):
        data = s.QueuePatch(data=request.data)
        data.is_valid(raise_exception=True)
        dry_run = _truthy(request, "dry_run")
        queue = services.queue_patch(name=name, changes=data.validated_data, dry_run=dry_run)
        if dry_run:
            seen = services.queue_signals(queue)
            queue.members = _queue_read(name).members
            queue.desired = elasticity.plan(queue, seen["signals"]).desired
            return Response(s.QueueDryRunSerializer(queue).data)
        return Response(s.QueueSerializer(_queue_read(name)).data)

    @extend_schema(
        summary="Remove a queue",
        parameters=[
            OpenApiParameter(
                "force",
                bool,
                description="unbind its daemons and kill its queued invocations first",
            )
        ],
        responses={200: OpenApiTypes.OBJECT, **errors(404, 409)},
    )
    def delete(self, request, name):
        return Response(services.queue_delete(name=name, force=_truthy(request, "force")))


class QueueAction(APIView):
    action_name = ""

    @extend_schema(request=None, responses={200: s.QueueSerializer, **errors(404, 409)})
    def post(self, request, name):
        services.queue_transition(name=name, action=self.action_name)
        return Response(s.QueueSerializer(_queue_read(name)).data)


def queue_action(action: str, summary: str):
    view = type(
        f"Queue{action.title()}",
        (QueueAction,),
        {"action_name": action},
    )
    return extend_schema(summary=summary)(view).as_view()


class QueueEvents(APIView):
    @extend_schema(
        summary="The elasticity audit trail, newest first (the default queue, "
        "'(default)', has none: the controller never acts on it)",
        parameters=[
            OpenApiParameter("limit", int, description="1–200, default 50"),
            OpenApiParameter("verbose", bool, description="include tick_noop rows"),
            OpenApiParameter("before", str, description="only events older than this id"),
        ],
        responses={200: s.EventSerializer(many=True), **errors(400, 404)},
    )
    def get(self, request, name):
        queue = services.queue_read(name)
        limit = bounded_int(request, "limit", default=50, low=1, high=200)
        if queue.pk is None:  # the default queue: the controller never acts on it
            return list_response([], None, s.EventSerializer)
        events = QueueEvent.objects.filter(queue=queue)
        if not _truthy(request, "verbose"):
            events = events.decisions()
        before = request.query_params.get("before")
        if before:
            before_id = bounded_int(request, "before", default=0, low=1, high=2**63 - 1)
            events = events.filter(id__lt=before_id)
        rows = list(events.order_by("-id")[: limit + 1])
        link = None
        if len(rows) > limit:
            link = next_link(request, before=rows[limit - 1].id, limit=limit)
        return list_response(rows[:limit], link, s.EventSerializer)


WINDOW = OpenApiParameter(
    "window",
    OpenApiTypes.STR,
    enum=list(insight.WINDOWS),
    description="What ended in the last hour (1h, the default: `last_hour`) "
    "or day (24h: `last_day`)",
)


class QueueStats(APIView):
    @extend_schema(
        summary="What the controller sees now, what its next tick would do, and what "
        "ended lately ('(default)' for the default queue)",
        parameters=[WINDOW],
        responses={200: s.StatsSerializer, **errors(400, 404)},
    )
    def get(self, request, name):
        span = services.stats_window(request.query_params.get("window"))
        stats = services.queue_stats(services.queue_read(name), span)
        return Response(s.StatsSerializer(stats).data)


class FleetStats(APIView):
    @extend_schema(
        summary="Every queue at once: live daemons, what waits and runs, what ended lately",
        parameters=[WINDOW],
        responses={200: s.FleetStatsSerializer, **errors(400)},
    )
    def get(self, request):
        span = services.stats_window(request.query_params.get("window"))
        return Response(s.FleetStatsSerializer(services.fleet_stats(span)).data)


# ---------------------------------------------------------------------------- lakeshore.yaml
