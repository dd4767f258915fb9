"""A connection may not hold a socket of the server for good by never finishing its
request's head (edge/http_protocol.py): silent, stopped after a few bytes,
or trickling a byte at a time, it is closed once the server's keep-alive has passed
since it opened (or since its last answer) without a whole request line and headers.
uvicorn alone kept all three open. The controls: a head sent in pieces within the
time is answered, a kept-alive connection serves its next request, and a claim that
waits longer than the keep-alive is answered at the end of its wait, not cut.

Against `make run`'s server, its keep-alive shortened to 2 s (GUNICORN_CMD_ARGS)."""

import asyncio
import contextlib
import json
import time

import pytest
from django.db import connection
from django.utils import timezone

from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.security]

KEEP = 2.0  # seconds: the server's keep-alive here
# Seconds of silence after which a connection counts as kept open (uvicorn alone kept
# them for good); a connection closed "at the keep-alive" is closed well within it.
OPEN_FOR = 30.0
HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """One server for the module, on the test database (django_db_setup made it)."""
    tmp_path = tmp_path_factory.mktemp("slow-head")
    env = environment(
        tmp_path, LAKESHORE_WEB_WORKERS="1", GUNICORN_CMD_ARGS=f"--keep-alive {KEEP:g}"
    )
    with gunicorn(tmp_path, env) as (base, _):
        yield int(env["PORT"]), base


async def _hold(port: int, pieces: list[bytes], every: float) -> tuple[float | None, bytes]:
    """Connect, send `pieces` `every` seconds apart, and read until the server closes
    the connection: (seconds from the connect to the close, or None if still open
    after OPEN_FOR s of silence; what the server sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()

    async def feed():
        with contextlib.suppress(ConnectionError):
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(every)

    feeding = asyncio.create_task(feed())
    got = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), OPEN_FOR):
            got += chunk
    except TimeoutError:
        return None, got
    except ConnectionError:
        pass
    finally:
        feeding.cancel()
        writer.close()
    return time.monotonic() - started, got


def _closed(port: int, pieces: list[bytes], every: float = 0.0) -> tuple[float | None, bytes]:
    return builders.run_async(_hold(port, pieces, every))


def test_a_connection_that_sends_nothing_is_closed_after_the_keep_alive(server):
    port, _ = server
    took, got = _closed(port, [])
    assert took is not None, f"still open after {OPEN_FOR:g} s"
    assert KEEP - 0.2 <= took < 10 * KEEP and got == b""


def test_a_head_stopped_after_a_few_bytes_is_closed(server):
    port, _ = server
    took, got = _closed(port, [HEAD[:20]])
    assert took is not None, f"still open after {OPEN_FOR:g} s"
    assert KEEP - 0.2 <= took < 10 * KEEP and got == b""


def test_a_head_trickled_a_byte_at_a_time_is_closed_before_it_is_whole(server):
    """A byte every 0.5 s: 21 s to send the whole head (10 times the keep-alive), and
    closed at the keep-alive, long before it is whole."""
    port, _ = server
    every = 0.5
    took, got = _closed(port, [bytes([b]) for b in HEAD], every=every)
    assert took is not None, f"still open after {OPEN_FOR:g} s"
    assert took < len(HEAD) * every and got == b""


def test_the_control_a_head_in_pieces_within_the_time_is_answered(server):
    port, _ = server
    took, got = _closed(port, [HEAD[:10], HEAD[10:25], HEAD[25:]], every=0.4)
    assert got.startswith(b"HTTP/1.1 200 ")
    # then kept alive, idle, for the keep-alive after its answer (about 0.8 s in)
    assert took is not None and KEEP + 0.6 <= took < 10 * KEEP


def test_the_control_a_kept_alive_connection_serves_its_next_request(server):
    port, _ = server
    took, got = _closed(port, [HEAD, HEAD, HEAD], every=KEEP * 0.6)
    assert got.count(b"HTTP/1.1 200 ") == 3
    assert took is not None and took >= 2 * KEEP * 0.6 + KEEP - 0.2


def test_the_control_a_claim_waiting_past_the_keep_alive_is_answered(server):
    """A claim that waits 4 s (twice the keep-alive) has sent its head: nothing cuts
    it, and it answers at the end of its wait."""
    port, base = server
    builders.queue(name="slow-head")
    daemon = builders.daemon(queues=["slow-head"], last_heartbeat_at=timezone.now())
    token = builders.token("operator")
    connection.close()
    body = json.dumps({"wait": 4}).encode()
    head = (
        f"POST /api/v1/daemons/{daemon.pk}/claim/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    took, got = _closed(port, [head + body])
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"[]")
    assert took is not None and 4 + KEEP - 0.2 <= took < 4 + 10 * KEEP
