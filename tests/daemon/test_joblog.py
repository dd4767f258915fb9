"""The daemon's side of job logs (lakeshore.joblog): bytes cut into lines the way a
reader expects, and the bounded book of lines waiting to be shipped."""

from hypothesis import given
from hypothesis import strategies as st

from lakeshore import joblog
from lakeshore.joblog import LINE_MAX_BYTES, Lines, LogBook


def test_lines_end_at_newlines_and_carriage_returns():
    lines = Lines("o")
    assert lines.feed(b"one\ntwo\r\nthree\rfour") == ["one", "two", "three"]
    assert lines.feed(b" more\n") == ["four more"]
    assert lines.feed(b"tail") == []
    assert lines.end() == ["tail"]
    assert lines.end() == []


def test_a_cr_lf_split_across_reads_is_one_line_end():
    lines = Lines("o")
    assert lines.feed(b"a\r") == ["a"]
    assert lines.feed(b"\nb\n") == ["b"]  # the \n ends the line "a" ended already
    assert lines.feed(b"\r") == [""] and lines.feed(b"\r") == [""]  # blank lines stay


def test_bad_bytes_and_nul_become_text_the_server_stores():
    assert Lines("e").feed(b"caf\xc3\xa9 \xff\x00end\n") == ["café \ufffd\\x00end"]


def test_a_long_line_comes_in_pieces_within_the_bound():
    lines = Lines("o")
    got = lines.feed(b"x" * (3 * LINE_MAX_BYTES + 10))
    assert [len(piece) for piece in got] == [LINE_MAX_BYTES] * 3
    assert lines.feed(b"\n") == ["x" * 10]


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_no_byte_is_lost_however_the_reads_fall(reads):
    lines = Lines("o")
    got = []
    for read in reads:
        got += lines.feed(read)
    got += lines.end()
    whole = b"".join(reads).decode("utf-8", errors="replace").replace("\x00", "\\x00")
    expected = whole.replace("\r\n", "\n").replace("\r", "\n")
    # every character arrives, in order, between the line ends
    assert "".join(got) == expected.replace("\n", "")
    assert all(len(line.encode()) <= LINE_MAX_BYTES for line in got)


def test_the_book_ships_chunks_numbered_per_attempt():
    book = LogBook()
    book.add((1, 1), "d1", "o", ["a", "b"])
    book.add((2, 1), "d1", "e", ["c"])
    chunks = book.take()
    assert [(c["invocation"], c["seq"], [line[2] for line in c["lines"]]) for c in chunks] == [
        (1, 0, ["a", "b"]),
        (2, 0, ["c"]),
    ]
    book.add((1, 1), "d1", "o", ["d"])
    last = book.take()
    assert [(c["invocation"], c["seq"]) for c in last] == [(1, 1)]
    assert book.take() == [] and book.pending()  # taken, not landed: still on its way
    book.landed(chunks + last)
    assert not book.pending()


def test_past_its_bound_the_book_drops_the_oldest_after_the_head_and_says_how_many():
    book = LogBook(max_bytes=100, head_keep=30)  # 10 bytes a line: the head is 3 lines
    book.add((1, 1), None, "o", [f"{i:09d}" for i in range(30)])
    assert book.bytes <= 100
    head, rest = book.take()
    assert [line[2] for line in head["lines"]] == [f"{i:09d}" for i in range(3)]
    assert head["dropped"] == 0
    assert rest["dropped"] == 20  # lost between the head and the last 7 lines
    assert [line[2] for line in rest["lines"]] == [f"{i:09d}" for i in range(23, 30)]
    assert book.dropped == 20


def test_a_shipment_stays_under_the_request_bound(monkeypatch):
    monkeypatch.setattr(joblog, "SHIPMENT_MAX_BYTES", 1000)
    book = LogBook()
    book.add((1, 1), None, "o", ["y" * 99] * 25)  # 2,500 bytes
    first = book.take()
    assert sum(len(line[2]) + 1 for c in first for line in c["lines"]) <= 1000
    rest = book.take() + book.take()
    assert sum(len(c["lines"]) for c in first + rest) == 25


def test_an_attempt_whose_lines_were_all_dropped_does_not_wait_on_the_shipper():
    """Another attempt fills the book; this one's only line is dropped. A count with no
    line to carry it must not keep the attempt pending (its outcome would wait for a
    shipment that never comes)."""
    book = LogBook(max_bytes=100, head_keep=0)
    book.add((1, 1), None, "o", [f"{i:09d}" for i in range(10)])  # 100 bytes: full
    book.add((2, 1), None, "o", ["overflow"])
    assert book.attempts[(2, 1)].dropped == 1
    assert not book.pending({(2, 1)})
    assert book.pending({(1, 1)})  # the control: lines waiting keep an attempt pending


def test_a_chunk_landing_after_its_attempt_was_forgotten_leaves_no_count_behind():
    """An abandoned invocation's lines are forgotten while a chunk of them is out; a late
    line begins the attempt again. That chunk's landing must not count against it, or
    its lines would seem on their way for ever."""
    book = LogBook()
    book.add((1, 1), "d1", "o", ["a"])
    out = book.take()
    book.forget((1, 1))
    book.add((1, 1), "d1", "o", ["late"])
    book.landed(out)
    late = book.take()
    assert book.pending()  # the late line is on its way
    book.landed(late)
    assert not book.pending()
