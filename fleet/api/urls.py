from django.urls import path

from fleet.api import views

NAME = "<str:name>"

urlpatterns = [
    path("providers/", views.ProviderList.as_view(), name="provider-list"),
    path(f"providers/{NAME}/", views.ProviderDetail.as_view(), name="provider-detail"),
    path("apply/", views.Apply.as_view(), name="apply"),
    path("export/", views.Export.as_view(), name="export"),
    path("daemons/", views.DaemonList.as_view(), name="daemon-list"),
    path("daemons/register/", views.DaemonRegisterView.as_view(), name="daemon-register"),
    path("daemons/<str:daemon_id>/", views.DaemonDetail.as_view(), name="daemon-detail"),
]
