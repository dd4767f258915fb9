"""What every console page's template gets (a context processor)."""

from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import redirect
from django.templatetags.static import static
from django.views.decorators.http import require_GET

# The navigation's sections: {view name (namespace:url name): the section it belongs to}.
SECTIONS = {
    "queues:list": "queues",
    "queues:detail": "queues",
    "queues:add": "queues",
    "queues:edit": "queues",
    "jobs:list": "jobs",
    "jobs:detail": "jobs",
    "fleet:daemons": "daemons",
    "accounts:events": "events",
    "accounts:tokens": "tokens",
}
# The pages the navigation links to: there its item is aria-current="page".
SECTION_PAGES = {
    "queues:list",
    "jobs:list",
    "fleet:daemons",
    "accounts:events",
    "accounts:tokens",
}


def context(request) -> dict:
    """`refresh`: the hx-trigger of boxes that refresh themselves ("every 5s").
    `nav`: the navigation's current section and whether this is its own page (then its
    item says aria-current="page", on a page below it aria-current="true")."""
    seconds = settings.LAKESHORE_CONSOLE_REFRESH_SECONDS
    match = getattr(request, "resolver_match", None)
    name = match.view_name if match else None
    nav = {"section": SECTIONS.get(name), "current": "page" if name in SECTION_PAGES else "true"}
    return {"refresh": f"every {seconds:g}s", "nav": nav}


@require_GET
def favicon(request):
    """/favicon.ico, which browsers and tools ask for whatever the page links: the
    console's icon (static/favicon.svg, served by WhiteNoise), by a permanent redirect."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))


def back_url(request, default: str) -> str:
    """Where a console action returns to: the page it was sent from (htmx says which, in
    HX-Current-URL; only its path and query are kept, so it never leaves this site), or
    `default`."""

    current = urlsplit(request.headers.get("HX-Current-URL", ""))
    if not current.path.startswith("/"):
        return default
    return current.path + (f"?{current.query}" if current.query else "")


def after_action(request, url: str):
    """Back to a page after a console action, as a full load (htmx follows HX-Redirect),
    so the action's message shows in the page's live region."""

    if request.htmx:
        return HttpResponse(status=204, headers={"HX-Redirect": url})
    return redirect(url)
