"""OpenAPI pieces shared by every view: the error body and the usual error answers."""

from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers

ErrorBody = inline_serializer(
    name="Error",
    fields={
        "error": inline_serializer(
            name="ErrorDetail",
            fields={
                "code": serializers.CharField(),
                "message": serializers.CharField(),
                "fields": serializers.DictField(child=serializers.CharField()),
            },
        )
    },
)

_TEXT = {
    400: "Bad input: `error.fields` names each bad field.",
    401: "No token, or an invalid, expired or revoked one.",
    403: "The token's role may not do this.",
    404: "No such object.",
    409: "The object's state forbids this.",
    429: "A bound is reached; `error.code` says which (`backlog_full`: the queue's backlog "
    "is full; `daemons_per_token`: the token's live daemons; `busy`, with Retry-After: the "
    "caller already runs as many heavy requests as it may).",
    503: "The server cannot take this now (`busy`, with Retry-After), or its database is "
    "unavailable (`unavailable`).",
}


def errors(*codes: int) -> dict:
    """`responses=` entries for the given status codes (401 and 403 always apply)."""
    wanted = sorted({401, 403, *codes})
    return {code: OpenApiResponse(ErrorBody, description=_TEXT[code]) for code in wanted}
