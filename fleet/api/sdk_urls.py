"""The SDK worker's routes under /v1/ (jobs/api/sdk_urls.py has the producer's)."""

from django.urls import path

from fleet.api import sdk_worker as views

urlpatterns = [
    path("daemon/poll", views.DaemonPoll.as_view(), name="sdk-poll"),
    path("daemon/ack", views.DaemonAck.as_view(), name="sdk-ack"),
    path("daemon/result-chunk", views.DaemonResultChunk.as_view(), name="sdk-result-chunk"),
]
