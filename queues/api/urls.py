from django.urls import path

from queues.api import views

NAME = "<str:name>"

urlpatterns = [
    path("stats/", views.FleetStats.as_view(), name="fleet-stats"),
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
]
