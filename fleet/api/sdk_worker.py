"""The SDK worker's doors: POST /v1/daemon/poll, ack and result-chunk (fleet/sdk_worker.py)."""

import logging
import time

from django.db import OperationalError, connection
from django.db.utils import InterfaceError
from rest_framework.response import Response

from accounts.permissions import DaemonProtocol
from fleet import sdk_worker
from jobs.api.long_poll import LongPollView
from jobs.api.sdk_views import SdkView

log = logging.getLogger("jobs.api.sdk_views")  # where operators have always read it


class DaemonPoll(LongPollView, SdkView):
    permission_classes = [DaemonProtocol]

    def post(self, request):
        steps = sdk_worker.poll_steps(request.data, user=request.user, token=request.auth)
        return self.long_poll(request, steps, Response)

    def handle_exception(self, exc):
        if not isinstance(exc, (OperationalError, InterfaceError)):
            return super().handle_exception(exc)
        # Any error answer ends the SDK's worker: a database that is away for a moment
        # answers "no work" after a pause instead, and the worker polls again.
        log.warning("SDK poll: database unavailable (%s); answering no work", exc)
        connection.close()
        time.sleep(1.0)
        return Response({"commands": []})


class DaemonAck(SdkView):
    permission_classes = [DaemonProtocol]

    def post(self, request):
        return Response(sdk_worker.ack(request.data, token=request.auth))


class DaemonResultChunk(SdkView):
    permission_classes = [DaemonProtocol]

    def post(self, request):
        return Response(sdk_worker.result_chunk(request.data, token=request.auth))
