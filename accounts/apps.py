from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self):
        # registers the OpenAPI auth scheme; in ready(): it needs the app registry
        from accounts import schema  # noqa: F401, PLC0415
