"""fleet's hot routes (jobs/api/hot_routes.py): the daemon protocol a daemon sends many
times a second, and the SDK worker's poll."""

import re

from fleet import protocol
from fleet.api import protocol_views
from fleet.api.sdk_worker import DaemonPoll
from jobs.api.hot_routes import HotRoute

_DAEMON = r"^/api/v1/daemons/(?P<daemon_id>[0-9]{1,19})/"

HOT_ROUTES = (
    HotRoute(
        "claim",
        "POST",
        re.compile(_DAEMON + r"claim/$"),
        protocol_views.DaemonClaim,
        "lean",
        answer=protocol_views.claim_answer,
        steps=protocol_views.claim_answer_steps,
        before_body=protocol_views.before_body,
        on_arrival=protocol.hear_on_arrival,
    ),
    HotRoute(
        "exchange",
        "POST",
        re.compile(_DAEMON + r"exchange/$"),
        protocol_views.DaemonExchange,
        "lean",
        answer=protocol_views.exchange_answer,
        steps=protocol_views.exchange_answer_steps,
        before_body=protocol_views.before_body,
        on_arrival=protocol.hear_on_arrival,
    ),
    HotRoute(
        "complete",
        "POST",
        re.compile(_DAEMON + r"complete/$"),
        protocol_views.DaemonComplete,
        "lean",
        answer=protocol_views.complete_answer,
        before_body=protocol_views.before_body,
    ),
    HotRoute(
        "heartbeat",
        "POST",
        re.compile(_DAEMON + r"heartbeat/$"),
        protocol_views.DaemonHeartbeat,
        "lean",
        answer=protocol_views.heartbeat_answer,
        before_body=protocol_views.before_body,
    ),
    HotRoute("sdk-poll", "POST", re.compile(r"^/v1/daemon/poll$"), DaemonPoll, "sdk-poll"),
)
