"""jobs' hot routes (hot_routes.py): submit, and the requests that wait for a job (the
SDK's await and result stream, a log's follow)."""

import re

from jobs.api import views
from jobs.api.hot_routes import HotRoute
from jobs.api.sdk_views import ProducerAwait, ProducerResultStream

_PRODUCER = r"^/v1/namespaces/(?P<namespace>[^/]+)/producer/"

HOT_ROUTES = (
    HotRoute(
        "submit",
        "POST",
        re.compile(r"^/api/v1/jobs/$"),
        views.JobList,
        "lean",
        answer=views.submit_answer,
    ),  # fmt: skip
    HotRoute("await", "POST", re.compile(_PRODUCER + r"await$"), ProducerAwait, "await"),
    HotRoute(
        "stream",
        "GET",
        re.compile(_PRODUCER + r"invocations/(?P<stream>[^/]+)/result/stream$"),
        ProducerResultStream,
        "stream",
    ),
    HotRoute(
        "follow",
        "GET",
        re.compile(r"^/api/v1/jobs/(?P<invocation_id>[^/]+)/logs/$"),
        views.JobLogs,
        "follow",
    ),
)
