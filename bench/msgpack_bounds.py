"""The SDK's msgpack parser (lakeshore_admin/msgpack_api.py) on hostile and ordinary
bodies: peak memory (tracemalloc) and time of one parse, bounded (this server) against
`unpackb`'s defaults (the parser's call before issue 17). Prints figures, asserts
nothing; needs no database. Times are taken under tracemalloc, which slows the
allocating parses several times over.

    .venv/bin/python bench/msgpack_bounds.py
"""

import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
os.environ.setdefault("DATABASE_URL", "postgresql://bench@127.0.0.1:1/unused")  # not opened

import django  # noqa: E402

django.setup()

import msgpack  # noqa: E402

from lakeshore_admin.msgpack_api import MsgPackParser, body_limit  # noqa: E402

MIB = 1024 * 1024


class Stream:
    def __init__(self, raw):
        self.raw = raw

    def read(self, size=-1):
        return self.raw


def flat(size: int) -> bytes:
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def nested(width: int) -> bytes:
    inner = b"\xdc" + width.to_bytes(2, "big") + b"\x80" * width
    return b"\xdc" + width.to_bytes(2, "big") + inner * width


def submit(blob: int) -> bytes:
    return msgpack.packb(
        {
            "invocation_id": "01J0000000000000000000000",
            "queue": "gpu",
            "function": {"module": "_native_wire", "qualname": "_native_wire.envelope"},
            "args_blob": b"\x00" * blob,
            "run_config": {"queue": "gpu", "priority": 0.0, "key": None, "env": {"A": "b"}},
            "code_context": {},
        },
        use_bin_type=True,
    )


def measure(parse) -> tuple[float, float, str]:
    """(peak MiB, seconds, outcome) of one parse."""
    gc.collect()  # the previous hostile parse's millions of objects are gone first
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = parse()
        outcome = f"decoded, {len(result):,} top-level items"
    except Exception as exc:  # noqa: BLE001 - the refusal is the figure
        outcome = f"refused: {str(exc)[:60]}…"
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / MIB
    tracemalloc.stop()
    return peak, seconds, outcome


def main():
    parser = MsgPackParser()
    bodies = {  # the ordinary ones first: the hostile ones leave the heap churned
        "an SDK poll": msgpack.packb({"worker_id": "h-01J", "timeout_s": 1.0, "queue": "q"}),
        "an SDK submit with a 10 MiB blob": submit(10 * MIB),
        f"flat: {body_limit() / MIB:.0f} MiB of empty maps": flat(body_limit()),
        "nested: 3,300 arrays of 3,300 empty maps": nested(3_300),
    }
    parser.parse(Stream(bodies["an SDK poll"]))  # warm: settings, first calls
    print(f"{'body':44} {'parser':9} {'peak MiB':>9} {'ms':>8}  outcome")
    for name, raw in bodies.items():
        for label, parse in (
            ("bounded", lambda raw=raw: parser.parse(Stream(raw))),
            ("defaults", lambda raw=raw: msgpack.unpackb(raw, raw=False, strict_map_key=False)),
        ):
            peak, seconds, outcome = measure(parse)
            print(f"{name:44} {label:9} {peak:9.1f} {seconds * 1000:8.2f}  {outcome}")


if __name__ == "__main__":
    main()
