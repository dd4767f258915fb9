"""The jobs' console pages: the list of jobs, a job's page with its log, and what an
operator does to jobs here (cancel many at once, kill, retry). Stopping a running job on
its daemon is fleet's (fleet/urls.py). lakeshore_admin/urls.py mounts these at the site's
root, so each path here is the one a browser shows."""

from django.urls import path

from jobs import log_views, views

app_name = "jobs"

urlpatterns = [
    path("jobs/", views.JobListPage.as_view(), name="list"),
    path("jobs/bulk-cancel/", views.job_bulk_cancel, name="bulk-cancel"),
    path("jobs/bulk-retry/", views.job_bulk_retry, name="bulk-retry"),
    path("jobs/<int:invocation_id>/", views.job_detail, name="detail"),
    path("jobs/<int:invocation_id>/log/", log_views.job_log, name="log"),
    path("jobs/<int:invocation_id>/log.txt", log_views.job_log_text, name="log-text"),
    path("jobs/<int:invocation_id>/kill/", views.job_kill, name="kill"),
    path("jobs/<int:invocation_id>/retry/", views.job_retry, name="retry"),
]
