"""The queues' console pages: the list of queues (the console's home page), a queue's
page, the forms that add and edit a queue, and its actions (drain, pause, …).
lakeshore_admin/urls.py mounts them at the site's root, so each path here is the one a
browser shows."""

from django.urls import path

from queues import views

app_name = "queues"

urlpatterns = [
    path("", views.QueueListPage.as_view(), name="list"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("queues/add/", views.queue_add, name="add"),
    path("queues/<str:name>/", views.queue_detail, name="detail"),
    path("queues/<str:name>/edit/", views.queue_edit, name="edit"),
    path("queues/<str:name>/<str:action>/", views.queue_action, name="action"),
]
