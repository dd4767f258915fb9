"""The hot routes the edge serves by a door of its own, as the apps declare them
(fleet/api/routes.py, jobs/api/routes.py): the one place the edge learns a path."""

from fleet.api.routes import HOT_ROUTES as FLEET_ROUTES
from jobs.api.hot_routes import HotRoute
from jobs.api.routes import HOT_ROUTES as JOBS_ROUTES

ROUTES: tuple[HotRoute, ...] = (*FLEET_ROUTES, *JOBS_ROUTES)


def hot_route(method: str, path: str) -> tuple[HotRoute, dict[str, str]] | None:
    """The route a request for `method` and `path` takes, and the view's arguments."""
    for route in ROUTES:
        arguments = route.arguments(method, path)
        if arguments is not None:
            return route, arguments
    return None
