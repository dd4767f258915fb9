"""The Python SDK's wire as the tests speak it. An SDK call's envelope, as its producer
packs it (ENVELOPE). An SDK route's answer read back as a dict: a success is msgpack; an
error is one line of text, `message (code)`, with the code in the Lakeshore-Error-Code
header (how the SDK shows errors: lakeshore_admin/api_errors.sdk_error)."""

import msgpack

CODE_HEADER = "Lakeshore-Error-Code"

ENVELOPE = msgpack.packb(
    {
        "v": 1,
        "id": "01J",
        "fn": {"kind": "ref", "module": "pkg.mod", "qualname": "train", "src_hash": "x"},
        "args": msgpack.packb([1]),
        "kwargs": msgpack.packb({}),
        "prefix": "",
        "key": None,
        "cfg": {},
        "parent": None,
    },
    use_bin_type=True,
)


def decoded(status: int, headers, content: bytes) -> dict:
    """{"error": {"code", "message"}} for an error, else the msgpack body ({} if empty)."""
    if status >= 400:
        text = content.decode()
        code = headers[CODE_HEADER]
        assert text.endswith(f" ({code})"), text
        return {"error": {"code": code, "message": text.removesuffix(f" ({code})")}}
    return msgpack.unpackb(content, raw=False, strict_map_key=False) if content else {}


def answer_of(response) -> dict:
    """decoded() of a Django test client's or httpx's response."""
    return decoded(response.status_code, response.headers, response.content)
