from django.contrib import admin, messages

from accounts.models import ApiToken
from accounts.services import token_revoke, tokens_visible_to


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "prefix",
        "user",
        "role",
        "name",
        "queues",
        "bound",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["role", "bound", "revoked_at", "expires_at"]
    search_fields = ["prefix", "name", "user__username"]
    # What a token may do is fixed when it is made: a wider role or scope is a new token.
    readonly_fields = [
        "prefix",
        "role",
        "queues",
        "bound",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_select_related = ["user"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # the secret must be shown once: use `manage.py create_token`

    def get_queryset(self, request):
        """The tokens accounts/services.py lets this user see: every one for an
        administrator (staff with view, add and change), only its own for other staff."""
        return tokens_visible_to(request.user)

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        for token in queryset:
            token_revoke(actor=request.user, token=token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).", messages.SUCCESS)
