"""msgpack in and out, for the Python SDK's routes (jobs/api/sdk_views.py).

The SDK (dreamlake-lakeshore) sends `content-type: application/x-msgpack` bodies with
blobs as msgpack bin, and decodes every successful answer as msgpack: a JSON body would
raise in the client. So these views answer msgpack whatever the Accept header says. An
error (status 400 or more) the SDK does not decode: it shows the body as text, so errors
answer a line of text (lakeshore_admin/api_errors.sdk_error).

A body is decoded within bounds. msgpack needs a byte for an empty map, which Python
holds in about 70: unbounded, an 11 MiB body of them became 11.5 million dicts and
800 MiB. Limits on each container's length alone do not prevent that (arrays of
arrays nest as many), so before decoding, the body's objects are counted from their
headers (count_objects) and a body of more than LAKESHORE_SDK_MAX_OBJECTS is refused
with 400; `unpackb` then runs with limits too (unpack_limits)."""

import msgpack
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer

from lakeshore.msgpack_count import count_objects
from lakeshore_admin.errors import TooLarge

MEDIA_TYPE = "application/x-msgpack"
ENVELOPE_BYTES = 1024 * 1024  # room for the rest of a body around its largest blob


def body_limit() -> int:
    return settings.LAKESHORE_SDK_MAX_BLOB_BYTES + ENVELOPE_BYTES


def unpack_limits() -> dict:
    """`unpackb`'s limits. A string or blob costs its own size once decoded: the body's
    limit bounds it (a blob past LAKESHORE_SDK_MAX_BLOB_BYTES still gets jobs/sdk.py's
    413). A map or array is at most the whole body's objects. The SDK sends no
    ExtType outside its blobs."""
    objects = settings.LAKESHORE_SDK_MAX_OBJECTS
    size = body_limit()
    return {
        "max_str_len": size,
        "max_bin_len": size,
        "max_array_len": objects,
        "max_map_len": objects,
        "max_ext_len": 0,
    }


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
        most = settings.LAKESHORE_SDK_MAX_OBJECTS
        if raw and count_objects(raw, most) > most:
            raise ParseError(
                f"The body holds more than {most:,} msgpack objects (map keys and values "
                "and array items, nested ones included; LAKESHORE_SDK_MAX_OBJECTS). An SDK "
                "body holds a few dozen: its data travels in bin blobs."
            )
        try:
            data = (
                msgpack.unpackb(raw, raw=False, strict_map_key=False, **unpack_limits())
                if raw
                else {}
            )
        except ValueError as exc:
            if "exceeds max_" not in str(exc):  # msgpack's words for its limits
                raise ParseError(f"The body is not msgpack: {exc}.") from None
            raise ParseError(
                f"The body is past a limit of the SDK's msgpack: {exc} (a map or array "
                f"holds at most {most:,} items, a string or blob {body_limit():,} bytes, "
                "and no ExtType is taken outside a blob)."
            ) from None
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
