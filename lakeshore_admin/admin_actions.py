"""What Django admin's actions share across the apps."""

from django.contrib import messages

from lakeshore_admin.errors import DomainError


def run_action(modeladmin, request, queryset, label: str, call) -> None:
    """Apply `call` to each object; report successes and each refusal's reason."""
    done = 0
    for obj in queryset:
        try:
            call(obj)
            done += 1
        except DomainError as exc:
            modeladmin.message_user(request, f"{obj}: {exc.message}", messages.ERROR)
    if done:
        modeladmin.message_user(request, f"{label}: {done} done.", messages.SUCCESS)
