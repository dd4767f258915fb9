"""List pagination for the API: the body stays a JSON array (so `--json | jq '.[]'`
works) and the next page travels in a `Link: <…>; rel="next"` header. One extra row is
fetched to know whether there is a next page: no COUNT(*)."""

from django.utils.http import urlencode
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response


def bounded_int(request, name: str, *, default: int, low: int, high: int | None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: f"must be a whole number, got {raw!r}."}) from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValidationError({name: f"must be {bound}, got {value}."})
    return value


def next_link(request, drop: tuple[str, ...] = (), **changes) -> str:
    params = request.query_params.copy()
    for key in drop:
        params.pop(key, None)
    for key, value in changes.items():
        params[key] = str(value)
    url = f"{request.build_absolute_uri(request.path)}?{urlencode(params, doseq=True)}"
    return f'<{url}>; rel="next"'


MAX_OFFSET = 10**9  # beyond any real list; keeps PostgreSQL's bigint out of reach


class LimitOffset:
    """`limit` (default, 1..max) and `offset` (≥ 0); out of range answers 400."""

    def __init__(self, *, default: int = 50, maximum: int = 200):
        self.default = default
        self.maximum = maximum

    def paginate(self, queryset, request):
        limit = bounded_int(request, "limit", default=self.default, low=1, high=self.maximum)
        offset = bounded_int(request, "offset", default=0, low=0, high=MAX_OFFSET)
        rows = list(queryset[offset : offset + limit + 1])
        link = next_link(request, limit=limit, offset=offset + limit) if len(rows) > limit else None
        return rows[:limit], link


def filtered(filterset_class, request, queryset):
    """Apply a list's FilterSet to the query string; bad values answer 400."""
    filterset = filterset_class(request.query_params, queryset=queryset)
    if not filterset.is_valid():
        raise ValidationError(filterset.errors)
    return filterset.qs


def list_response(rows, link, serializer_class) -> Response:
    response = Response(serializer_class(rows, many=True).data)
    if link:
        response["Link"] = link
    return response


LIMIT = OpenApiParameter("limit", int, description="page size")


OFFSET = OpenApiParameter("offset", int, description="rows to skip (≥ 0)")
