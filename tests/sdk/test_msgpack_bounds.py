"""Issue 17, "Bound every parser": an SDK body of many tiny msgpack containers is refused
with 400 before it is decoded, by a daemon's own token on the SDK poll; an SDK body as
the SDK sends it (a blob up to LAKESHORE_SDK_MAX_BLOB_BYTES) still passes.

Negative controls: `unpackb` with its defaults (the parser's call before issue 17)
accepts the same bytes and makes a dict per byte; limits on each container's length
alone accept the same number of dicts nested in arrays of arrays."""

import tracemalloc

import msgpack
import pytest

from jobs import sdk
from lakeshore import sdk_job
from lakeshore.msgpack_count import count_objects
from lakeshore_admin.msgpack_api import MsgPackParser, body_limit, unpack_limits
from tests.support import builders
from tests.support.sdk_wire import answer_of

pytestmark = [pytest.mark.django_db, pytest.mark.security]

MIB = 1024 * 1024
POLL = "/v1/daemon/poll"
SUBMIT = "/v1/namespaces/default/producer/submit"


def flat(size: int) -> bytes:
    """An array of empty maps, `size` bytes: one dict per byte once decoded."""
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def nested(width: int) -> bytes:
    """An array of `width` arrays of `width` empty maps: no container longer than
    `width`, width² dicts."""
    inner = b"\xdc" + width.to_bytes(2, "big") + b"\x80" * width
    return b"\xdc" + width.to_bytes(2, "big") + inner * width


def post(api, path, raw: bytes, token: str):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = api.generic("POST", path, raw, content_type="application/x-msgpack")
    return response.status_code, answer_of(response)


def peak_mib(parse) -> tuple[float, object]:
    """(peak MiB allocated while `parse` ran, what it returned or raised)."""
    tracemalloc.start()
    try:
        try:
            result = parse()
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            result = exc
        return tracemalloc.get_traced_memory()[1] / MIB, result
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("bomb", ["flat", "nested"])
def test_a_body_of_tiny_containers_gets_400_naming_the_limit(api, bomb):
    raw = flat(body_limit()) if bomb == "flat" else nested(3_300)
    status, body = post(api, POLL, raw, builders.token("daemon"))
    assert status == 400
    assert body["error"]["code"] == "invalid"
    assert "10,000 msgpack objects" in body["error"]["message"]
    assert "LAKESHORE_SDK_MAX_OBJECTS" in body["error"]["message"]


def test_the_refusal_costs_no_memory_and_the_control_costs_a_dict_per_byte():
    raw = flat(MIB)
    parser = MsgPackParser()
    guarded, refused = peak_mib(lambda: parser.parse(_Stream(raw)))
    assert "LAKESHORE_SDK_MAX_OBJECTS" in str(refused)
    assert guarded < 1, guarded
    # control: the previous call, unpackb's defaults
    control, decoded = peak_mib(lambda: msgpack.unpackb(raw, raw=False, strict_map_key=False))
    assert len(decoded) == MIB - 5
    assert control > 50, control  # about 70 bytes per byte of body
    print(f"\n1 MiB of empty maps: bounded peak {guarded:.2f} MiB, defaults {control:.0f} MiB")


def test_control_container_limits_alone_let_nesting_through():
    """What `max_array_len`/`max_map_len` allow when the object count is not checked:
    a million dicts from a 1 MiB body."""
    raw = nested(1_000)
    decoded = msgpack.unpackb(raw, raw=False, strict_map_key=False, **unpack_limits())
    assert sum(len(inner) for inner in decoded) == 1_000_000
    assert count_objects(raw, 10_000) > 10_000  # what the parser checks first


def test_each_unpackb_limit_is_named_when_it_answers(settings, api):
    """An ExtType outside a blob (the SDK sends none): refused by max_ext_len."""
    raw = msgpack.packb({"worker_id": "w", "x": msgpack.ExtType(1, b"abc")})
    status, body = post(api, POLL, raw, builders.token("daemon"))
    assert status == 400 and "max_ext_len" in body["error"]["message"]


def test_an_sdk_submit_with_a_blob_at_the_limit_still_passes(settings, api):
    settings.LAKESHORE_SDK_MAX_BLOB_BYTES = 2 * MIB
    builders.queue(name="gpu")
    body = {
        "invocation_id": "01J0000000000000000000000",
        "queue": "gpu",
        "function": {
            "module": "_native_wire",
            "qualname": "_native_wire.envelope",
            "version": "v1",
        },
        "args_blob": b"\x00" * (2 * MIB),
        "run_config": {
            "queue": "gpu",
            "priority": 1.0,
            "key": None,
            "env": {f"VAR_{i}": "x" * 100 for i in range(500)},
            "host_setup": ["pip install x"] * 50,
        },
        "code_context": {},
    }
    status, answer = post(api, SUBMIT, msgpack.packb(body, use_bin_type=True), builders.token())
    assert status == 201, answer


class _Stream:
    def __init__(self, raw):
        self.raw = raw

    def read(self, size=-1):
        return self.raw


def _many_maps(count: int) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def test_a_submitted_blob_of_many_objects_is_never_decoded_to_read_its_function():
    """An operator's args_blob of a million empty maps: the server reads it as a bare
    value from its headers alone, instead of decoding it to look for an Envelope."""
    blob = _many_maps(1_000_000)
    tracemalloc.start()
    try:
        assert sdk.describe(blob) == ("value", sdk.VALUE_FUNCTION)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak


def test_control_decoding_the_blob_to_look_for_an_envelope_costs_tens_of_mib(monkeypatch):
    monkeypatch.setattr(sdk_job, "ENVELOPE_OBJECTS_MAX", 10**9)
    blob = _many_maps(1_000_000)
    tracemalloc.start()
    try:
        assert sdk.describe(blob) == ("value", sdk.VALUE_FUNCTION)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak > 30 * 1024 * 1024, peak
