"""Roles are Django groups named after them. Staff and superusers act as operators.

A user's roles say what the user may do; a token's role says what that token may do,
never more than its user may. A request made with a token carries the roles both
allow (`bind_token`, called when the token authenticates): a viewer token made for an
operator reads and never acts, and an operator token whose user lost the role no
longer acts either. The console's login sessions carry the user's own roles."""

from django.contrib.auth.models import Group

from accounts.models import Role

READ_ROLES = {Role.VIEWER, Role.OPERATOR}
ACT_ROLES = {Role.OPERATOR}

# What holding a role lets one do: an operator also reads and speaks the daemon protocol.
IMPLIED = {
    Role.OPERATOR.value: {Role.OPERATOR.value, Role.VIEWER.value, Role.DAEMON.value},
    Role.VIEWER.value: {Role.VIEWER.value},
    Role.DAEMON.value: {Role.DAEMON.value},
}


def user_roles(user) -> set[str]:
    """The roles the user holds (groups; staff and superusers are operators)."""
    roles = set(user.groups.values_list("name", flat=True)) & {r.value for r in Role}
    if user.is_superuser or user.is_staff:
        roles.add(Role.OPERATOR.value)
    return roles


def _implied(roles) -> set[str]:
    return {granted for role in roles for granted in IMPLIED.get(role, ())}


def may_hold(user, role: str) -> bool:
    """Whether a token of `role` gives `user` nothing beyond the user's own roles."""
    return role in _implied(user_roles(user))


def acts_with(user, role: str) -> bool:
    """Whether `role` is within what this request's user may do now (its token's role
    and its own): a token of `role` made by it gives nothing above its own."""
    return role in _implied(roles_of(user))


def roles_of(user) -> set[str]:
    if user is None or not user.is_authenticated:
        return set()
    cached = getattr(user, "_lakeshore_roles", None)
    if cached is None:
        cached = user_roles(user)
        user._lakeshore_roles = cached
    return cached


def bind_token(user, token) -> None:
    """From now on `user` (this request's, loaded with its token) has the roles both it
    and the token's role allow."""
    user._lakeshore_roles = _implied(user_roles(user)) & IMPLIED.get(token.role, set())


def can_operate(user) -> bool:
    """Acting (not only reading) needs the operator role; staff have it."""
    return bool(roles_of(user) & ACT_ROLES)


def grant(user, role: str) -> None:
    group, _ = Group.objects.get_or_create(name=Role(role).value)
    user.groups.add(group)
    user.__dict__.pop("_lakeshore_roles", None)
