from django.urls import path

from jobs.api import sdk_views, views

urlpatterns = [
    path("jobs/", views.JobList.as_view(), name="job-list"),
    path("jobs/bulk-cancel/", views.JobBulkCancel.as_view(), name="job-bulk-cancel"),
    path("jobs/bulk-retry/", views.JobBulkRetry.as_view(), name="job-bulk-retry"),
    path("jobs/<str:invocation_id>/", views.JobDetail.as_view(), name="job-detail"),
    path("jobs/<str:invocation_id>/logs/", views.JobLogs.as_view(), name="job-logs"),
    path("jobs/<str:invocation_id>/kill/", views.JobKill.as_view(), name="job-kill"),
    path("jobs/<str:invocation_id>/retry/", views.JobRetry.as_view(), name="job-retry"),
    path("sdk/", sdk_views.SdkSettings.as_view(), name="sdk-settings"),
]
