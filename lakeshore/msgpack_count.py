"""How many objects a msgpack value holds, read from its headers alone: nothing is
decoded, so a hostile body of millions of empty maps costs microseconds, not the
gigabytes decoding it would (issue 17). The server counts every SDK body before
decoding it (lakeshore_admin/msgpack_api.py), and an SDK Envelope before reading its
function (lakeshore/sdk_job.describe). No Django here: the daemon uses it too."""

# A msgpack header's first byte → what follows it (the format's spec, msgpack.org):
_FIXED = {  # nil, false, true, floats, ints, fixext: the whole object's size
    0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9,
    0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18,
}  # fmt: skip
_SIZED = {  # bin, ext, str: (bytes of the length, bytes between it and the data)
    0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
    0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),
}  # fmt: skip
_COUNTED = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # array, map: (bytes
# of the count, objects per entry)


def count_objects(raw: bytes, most: int) -> int:
    """How many objects the first msgpack object in `raw` is, itself and everything
    it nests (map keys and values, array items), counting to `most` + 1 at most.
    Only headers are read: a string or blob is stepped over, nothing is decoded.
    Bytes that are not msgpack end the count (unpackb says what is wrong)."""
    at, pending, seen, end = 0, 1, 0, len(raw)
    while pending and seen <= most and at < end:
        pending -= 1
        seen += 1
        first = raw[at]
        if first <= 0x7F or first >= 0xE0:  # fixint
            at += 1
        elif first <= 0x8F:  # fixmap
            pending += 2 * (first & 0x0F)
            at += 1
        elif first <= 0x9F:  # fixarray
            pending += first & 0x0F
            at += 1
        elif first <= 0xBF:  # fixstr
            at += 1 + (first & 0x1F)
        elif first in _FIXED:
            at += _FIXED[first]
        elif first in _SIZED:
            width, gap = _SIZED[first]
            at += 1 + width + gap + int.from_bytes(raw[at + 1 : at + 1 + width], "big")
        elif first in _COUNTED:
            width, per = _COUNTED[first]
            pending += per * int.from_bytes(raw[at + 1 : at + 1 + width], "big")
            at += 1 + width
        else:  # 0xC1, never used
            break
    return seen
