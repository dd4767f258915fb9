from django.urls import path

from jobs.api import views

urlpatterns = [
    path("jobs/", views.JobList.as_view(), name="job-list"),
    path("jobs/bulk-cancel/", views.JobBulkCancel.as_view(), name="job-bulk-cancel"),
    path("jobs/<str:invocation_id>/", views.JobDetail.as_view(), name="job-detail"),
    path("jobs/<str:invocation_id>/kill/", views.JobKill.as_view(), name="job-kill"),
    path("jobs/<str:invocation_id>/retry/", views.JobRetry.as_view(), name="job-retry"),
    path(
        "daemons/<str:daemon_id>/heartbeat/",
        views.DaemonHeartbeat.as_view(),
        name="daemon-heartbeat",
    ),
    path("daemons/<str:daemon_id>/claim/", views.DaemonClaim.as_view(), name="daemon-claim"),
    path(
        "daemons/<str:daemon_id>/complete/",
        views.DaemonComplete.as_view(),
        name="daemon-complete",
    ),
    path(
        "daemons/<str:daemon_id>/exchange/",
        views.DaemonExchange.as_view(),
        name="daemon-exchange",
    ),
    path("daemons/<str:daemon_id>/exec/", views.DaemonExec.as_view(), name="daemon-exec"),
    path(
        "daemons/<str:daemon_id>/commands/<str:command_id>/done/",
        views.DaemonCommandDone.as_view(),
        name="daemon-command-done",
    ),
    path(
        "daemons/<str:daemon_id>/deregister/",
        views.DaemonDeregister.as_view(),
        name="daemon-deregister",
    ),
]
