from django.urls import path

from fleet.api import protocol_views, views

NAME = "<str:name>"

urlpatterns = [
    path("providers/", views.ProviderList.as_view(), name="provider-list"),
    path(f"providers/{NAME}/", views.ProviderDetail.as_view(), name="provider-detail"),
    path("apply/", views.Apply.as_view(), name="apply"),
    path("export/", views.Export.as_view(), name="export"),
    path("daemons/", views.DaemonList.as_view(), name="daemon-list"),
    path("daemons/register/", views.DaemonRegisterView.as_view(), name="daemon-register"),
    path("daemons/<str:daemon_id>/", views.DaemonDetail.as_view(), name="daemon-detail"),
    path(
        "daemons/<str:daemon_id>/heartbeat/",
        protocol_views.DaemonHeartbeat.as_view(),
        name="daemon-heartbeat",
    ),
    path(
        "daemons/<str:daemon_id>/claim/", protocol_views.DaemonClaim.as_view(), name="daemon-claim"
    ),
    path(
        "daemons/<str:daemon_id>/complete/",
        protocol_views.DaemonComplete.as_view(),
        name="daemon-complete",
    ),
    path(
        "daemons/<str:daemon_id>/exchange/",
        protocol_views.DaemonExchange.as_view(),
        name="daemon-exchange",
    ),
    path("daemons/<str:daemon_id>/logs/", protocol_views.DaemonLogs.as_view(), name="daemon-logs"),
    path("daemons/<str:daemon_id>/exec/", protocol_views.DaemonExec.as_view(), name="daemon-exec"),
    path(
        "daemons/<str:daemon_id>/commands/<str:command_id>/done/",
        protocol_views.DaemonCommandDone.as_view(),
        name="daemon-command-done",
    ),
    path(
        "daemons/<str:daemon_id>/deregister/",
        protocol_views.DaemonDeregister.as_view(),
        name="daemon-deregister",
    ),
]
