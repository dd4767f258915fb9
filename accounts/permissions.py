from rest_framework import permissions

from accounts.models import Role
from accounts.roles import READ_ROLES, can_operate, roles_of


class ReadOrOperate(permissions.BasePermission):
    """viewer and operator read; only operator acts. daemon tokens get nothing here."""

    message = "Your role may not do this."

    def has_permission(self, request, view):
        roles = roles_of(request.user)
        if request.method in permissions.SAFE_METHODS:
            if roles & READ_ROLES:
                return True
            self.message = "Reading needs the viewer or operator role."
            return False
        if can_operate(request.user):
            return True
        self.message = "This action needs the operator role."
        return False


class DaemonProtocol(permissions.BasePermission):
    """The daemon protocol: daemon tokens (only for their own daemon: checked by the
    view against the daemon's owner) and operators."""

    message = "The daemon protocol needs the daemon or operator role."

    def has_permission(self, request, view):
        return bool(roles_of(request.user) & {Role.DAEMON, Role.OPERATOR})


class Operate(permissions.BasePermission):
    """Only operators, whatever the method (the SDK's producer calls: submit, await and
    the result stream all act for a user who submits)."""

    message = "This needs the operator role."

    def has_permission(self, request, view):
        return can_operate(request.user)
