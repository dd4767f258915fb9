"""msgpack in and out, for the Python SDK's routes (jobs/api/sdk_views.py).

The SDK (dreamlake-lakeshore) sends `content-type: application/x-msgpack` bodies with
blobs as msgpack bin, and decodes every answer as msgpack, errors included: a JSON
body would raise in the client even on success. So these views always answer msgpack,
whatever the Accept header says, and the error bodies are the API's usual
`{"error": {"code", "message", …}}`, packed."""

import msgpack
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer

from lakeshore_admin.errors import TooLarge

MEDIA_TYPE = "application/x-msgpack"
ENVELOPE_BYTES = 1024 * 1024  # room for the rest of a body around its largest blob


def body_limit() -> int:
    return settings.LAKESHORE_SDK_MAX_BLOB_BYTES + ENVELOPE_BYTES


class MsgPackParser(BaseParser):
    media_type = MEDIA_TYPE

    def parse(self, stream, media_type=None, parser_context=None):
        limit = body_limit()
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise _too_large(len(raw), limit)
        try:
            data = msgpack.unpackb(raw, raw=False, strict_map_key=False) if raw else {}
        except Exception as exc:  # noqa: BLE001 - any undecodable body is the caller's
            raise ParseError(f"The body is not msgpack: {exc}.") from None
        if not isinstance(data, dict):
            raise ParseError("The body must be a msgpack map.")
        return data


def _too_large(size: int, limit: int) -> TooLarge:
    return TooLarge(
        f"The request body is {size:,} bytes; the limit is {limit:,} (a blob or frame "
        f"may hold {settings.LAKESHORE_SDK_MAX_BLOB_BYTES:,}: LAKESHORE_SDK_MAX_BLOB_BYTES).",
        extra={"limit": limit},
    )


class MsgPackRenderer(BaseRenderer):
    media_type = MEDIA_TYPE
    format = "msgpack"
    charset = None
    render_style = "binary"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        return msgpack.packb(data, use_bin_type=True, default=str)


class AlwaysMsgPack(BaseContentNegotiation):
    """The SDK accepts */*; anything else asking gets msgpack all the same."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type
