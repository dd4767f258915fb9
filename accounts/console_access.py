"""The console's door: every page and action of every app needs a login, then the
API's own role rule (accounts/permissions.py)."""

from functools import partial, wraps

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from rest_framework.permissions import SAFE_METHODS

from accounts.models import Role
from accounts.permissions import Operate, ReadOrOperate
from accounts.roles import roles_of


def console_view(view=None, *, operators_only: bool = False):
    """Every console page and action: a login, then the API's own rule (ReadOrOperate):
    reading needs the viewer or operator role, acting (POST) the operator role; staff
    act as operators. With operators_only (a form that acts: `@console_view(
    operators_only=True)`), even reading needs the operator role (the API's Operate).
    Without the role, a 403 page names the role and who grants it."""
    if view is None:
        return partial(console_view, operators_only=operators_only)

    @wraps(view)
    @login_required
    def checked(request, *args, **kwargs):
        rule = Operate() if operators_only else ReadOrOperate()
        if rule.has_permission(request, view):
            return view(request, *args, **kwargs)
        reading = request.method in SAFE_METHODS and not operators_only
        context = {
            "reason": rule.message,
            "needed": (Role.VIEWER if reading else Role.OPERATOR).value,
            "roles": sorted(roles_of(request.user)),
        }
        return render(request, "console/forbidden.html", context, status=403)

    return checked
