"""The Python SDK's routes (dreamlake-lakeshore 0.5.0): thin msgpack views over
jobs/sdk.py, which answers through the same services as the REST API.

    POST /v1/namespaces/<ns>/producer/submit                          operator
    POST /v1/namespaces/<ns>/producer/await                           operator
    GET  /v1/namespaces/<ns>/producer/invocations/<id>/result/stream  operator
    POST /v1/daemon/poll · /v1/daemon/ack · /v1/daemon/result-chunk   daemon (or operator)

No token: 401; a viewer: 403; another namespace: 404 (namespace_unknown). Bodies are
msgpack both ways (lakeshore_admin/msgpack_api.py), except errors: one line of text, as
the SDK shows it (lakeshore_admin/api_errors.sdk_error)."""

import logging

from django.conf import settings
from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import Operate
from accounts.roles import roles_of
from jobs import sdk
from jobs.api.long_poll import LongPollView
from jobs.api.serializers import SdkSetup
from lakeshore_admin.api_docs import errors
from lakeshore_admin.api_errors import sdk_answer
from lakeshore_admin.msgpack_api import AlwaysMsgPack, MsgPackParser, MsgPackRenderer

log = logging.getLogger(__name__)
STREAM_MEDIA_TYPE = "application/x-msgpack-stream"


@extend_schema(exclude=True)  # msgpack, not JSON: documented in the README ("From Python")
class SdkView(APIView):
    parser_classes = [MsgPackParser]
    renderer_classes = [MsgPackRenderer]
    content_negotiation_class = AlwaysMsgPack

    def handle_exception(self, exc):
        return sdk_answer(super().handle_exception(exc))


class ProducerSubmit(SdkView):
    permission_classes = [Operate]

    def post(self, request, namespace):
        sdk.check_namespace(namespace)
        invocation, created = sdk.submit(request.data)
        return Response(
            {"invocation_id": str(invocation.pk), "created": created},
            status=201 if created else 200,
        )


class ProducerAwait(LongPollView, SdkView):
    permission_classes = [Operate]

    def post(self, request, namespace):
        sdk.check_namespace(namespace)
        return self.long_poll(request, sdk.await_steps(request.data), Response)


class ProducerResultStream(SdkView):
    permission_classes = [Operate]

    def get(self, request, namespace, invocation_id):
        since = sdk.stream_start(namespace, invocation_id, request.query_params.get("since", "-1"))
        response = StreamingHttpResponse(
            sdk.open_frames(invocation_id, since), content_type=STREAM_MEDIA_TYPE
        )
        response["Cache-Control"] = "no-store"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold frames back
        return response


class SdkSettings(APIView):
    """GET /api/v1/sdk/ (JSON): what the SDK needs to reach this server as the caller,
    read by `lakeshore auth env --sdk`. Any token may ask, a daemon's too."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        summary="How the Python SDK reaches this server, for the caller",
        responses={200: SdkSetup, **errors()},
    )
    def get(self, request):
        return Response(
            {
                "url_path": "/v1/",
                "namespace": settings.LAKESHORE_SDK_NAMESPACE,
                "user": request.user.get_username(),
                "roles": sorted(roles_of(request.user)),
            }
        )
