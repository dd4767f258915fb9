from django.urls import path

from accounts.api import views

urlpatterns = [
    path("tokens/", views.TokenList.as_view(), name="token-list"),
    path("tokens/<str:token_id>/revoke/", views.TokenRevoke.as_view(), name="token-revoke"),
]
