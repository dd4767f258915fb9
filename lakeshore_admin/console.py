"""What every console page's template gets (a context processor)."""

from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import redirect


def context(request) -> dict:
    """`refresh`: the hx-trigger of boxes that refresh themselves ("every 5s")."""
    seconds = settings.LAKESHORE_CONSOLE_REFRESH_SECONDS
    return {"refresh": f"every {seconds:g}s"}


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
