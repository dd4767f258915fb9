"""The edge learns its paths from the apps (fleet/api/routes.py, jobs/api/routes.py),
and each declaration names the view Django serves that path with: a door that takes a
request answers for the same view, with the same permission classes, as Django would
had it not taken it."""

import re
import uuid

import pytest
from django.urls import Resolver404, resolve

from edge.application import DOORS
from edge.routes import ROUTES, hot_route

SAMPLES = ("1", str(uuid.uuid4()), "default")


def _paths(route):
    """Paths of the route's pattern, each named group given each sample value."""
    pattern = route.path.pattern.lstrip("^").rstrip("$")
    names = route.path.groupindex
    for value in SAMPLES:
        path = re.sub(r"\(\?P<[a-z_]+>[^)]*\)", value, pattern).replace("\\", "")
        if route.path.match(path) and len(route.path.match(path).groupdict()) == len(names):
            yield path


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.name)
def test_each_declared_route_is_the_path_django_serves_with_its_view(route):
    served = []
    for path in _paths(route):
        try:
            served.append(resolve(path).func.view_class)
        except Resolver404:
            continue
    assert route.view in served, (route.name, served)


def test_a_route_is_found_by_its_method_and_path_only():
    claim = hot_route("POST", "/api/v1/daemons/7/claim/")
    assert claim is not None and claim[0].name == "claim" and claim[1] == {"daemon_id": "7"}
    assert hot_route("GET", "/api/v1/daemons/7/claim/") is None  # another method
    assert hot_route("POST", "/api/v1/daemons/7/claim/extra/") is None
    assert hot_route("POST", "/api/v1/daemons/x/claim/") is None


def test_every_declared_door_is_one_the_edge_has():
    assert {route.door for route in ROUTES} <= set(DOORS)
