from django.urls import path

from queues.api import views

NAME = "<str:name>"

urlpatterns = [
    path("queues/", views.QueueList.as_view(), name="queue-list"),
    path(f"queues/{NAME}/", views.QueueDetail.as_view(), name="queue-detail"),
    path(f"queues/{NAME}/events/", views.QueueEvents.as_view(), name="queue-events"),
    path(f"queues/{NAME}/stats/", views.QueueStats.as_view(), name="queue-stats"),
    path(
        f"queues/{NAME}/drain/",
        views.queue_action("drain", "Stop admitting; let admitted work finish"),
        name="queue-drain",
    ),
    path(
        f"queues/{NAME}/pause/",
        views.queue_action("pause", "Admit but dispatch nothing; hold the pool's size"),
        name="queue-pause",
    ),
    path(
        f"queues/{NAME}/resume/",
        views.queue_action("resume", "Make the queue active again"),
        name="queue-resume",
    ),
    path(
        f"queues/{NAME}/archive/",
        views.queue_action("archive", "Soft-delete: keep the row, accept no work"),
        name="queue-archive",
    ),
    path(
        f"queues/{NAME}/unarchive/",
        views.queue_action("unarchive", "Make a drained or archived queue active"),
        name="queue-unarchive",
    ),
    path("providers/", views.ProviderList.as_view(), name="provider-list"),
    path(f"providers/{NAME}/", views.ProviderDetail.as_view(), name="provider-detail"),
    path("apply/", views.Apply.as_view(), name="apply"),
    path("export/", views.Export.as_view(), name="export"),
    path("daemons/", views.DaemonList.as_view(), name="daemon-list"),
    path("daemons/register/", views.DaemonRegisterView.as_view(), name="daemon-register"),
    path("daemons/<str:daemon_id>/", views.DaemonDetail.as_view(), name="daemon-detail"),
]
