"""The fleet's console pages: the list of daemons, dropping a daemon, and stopping a job
where it runs (an order to its daemon, as `lakeshore daemon exec` gives; the job's page
shows the button). lakeshore_admin/urls.py mounts them at the site's root, so each path
here is the one a browser shows."""

from django.urls import path

from fleet import views

app_name = "fleet"

urlpatterns = [
    path("daemons/", views.DaemonListPage.as_view(), name="daemons"),
    path("daemons/<int:daemon_id>/drop/", views.daemon_drop, name="daemon-drop"),
    path("daemons/<int:daemon_id>/jobs/<int:invocation_id>/stop/", views.job_stop, name="job-stop"),
]
