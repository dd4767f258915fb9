"""Roles are Django groups named after them. Staff and superusers act as operators."""

from django.contrib.auth.models import Group

from accounts.models import Role

READ_ROLES = {Role.VIEWER, Role.OPERATOR}
ACT_ROLES = {Role.OPERATOR}


def roles_of(user) -> set[str]:
    if user is None or not user.is_authenticated:
        return set()
    cached = getattr(user, "_lakeshore_roles", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True)) & {r.value for r in Role}
        if user.is_superuser or user.is_staff:
            cached.add(Role.OPERATOR.value)
        user._lakeshore_roles = cached
    return cached


def can_operate(user) -> bool:
    """Acting (not only reading) needs the operator role; staff have it."""
    return bool(roles_of(user) & ACT_ROLES)


def grant(user, role: str) -> None:
    group, _ = Group.objects.get_or_create(name=Role(role).value)
    user.groups.add(group)
    user.__dict__.pop("_lakeshore_roles", None)
