"""The Python SDK's addresses (no trailing slash: the SDK's own spelling)."""

from django.urls import path

from jobs.api import sdk_views as views

urlpatterns = [
    path(
        "namespaces/<str:namespace>/producer/submit",
        views.ProducerSubmit.as_view(),
        name="sdk-submit",
    ),
    path(
        "namespaces/<str:namespace>/producer/await",
        views.ProducerAwait.as_view(),
        name="sdk-await",
    ),
    path(
        "namespaces/<str:namespace>/producer/invocations/<str:invocation_id>/result/stream",
        views.ProducerResultStream.as_view(),
        name="sdk-stream",
    ),
]
