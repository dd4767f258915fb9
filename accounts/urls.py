"""The accounts' console pages: the events (the audit trail) and the API tokens, with
revoking one. lakeshore_admin/urls.py mounts them at the site's root, so each path here
is the one a browser shows. Logging in and out are Django's own views, mounted there."""

from django.urls import path

from accounts import views

app_name = "accounts"

urlpatterns = [
    path("events/", views.EventListPage.as_view(), name="events"),
    path("tokens/", views.TokenListPage.as_view(), name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]
