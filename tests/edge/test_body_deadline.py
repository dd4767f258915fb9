"""Issue 29, item 1: a request that declares a body and never sends it holds no thread.
Any POST with a well-formed `csrftoken` cookie makes Django's CSRF check read the body;
through the ASGI→WSGI bridge that read held a worker thread with no deadline, so a few
hundred such requests stalled every page. Now the body is received on the event loop
before a thread serves the request (edge/application.py), and it is due within
LAKESHORE_BODY_SECONDS of the head: past it the server answers 408 `body_timeout`
and closes the connection (edge/http_protocol.py).

Against `make run`'s server (one worker: 128 threads, fewer than the 300 sockets),
its body deadline shortened to 12 s. The control: a body sent slowly but within the
deadline is read and served (a console login), and a body past Django's limit is
refused from its declared length, at once, without being received."""

import asyncio
import contextlib
import time

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connection

from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("load"),  # 300 connections at once
    pytest.mark.security,
]

BODY_SECONDS = 12.0
SOCKETS = 300
CSRF = "a" * 32  # a well-formed CSRF secret: Django reads the form to compare it
PASSWORD = "pw-for-tests-only"


def server_user(username: str) -> None:
    """A console user with PASSWORD, hashed as the server checks it (the tests' own
    hasher is MD5, which the server does not know)."""
    hasher = PBKDF2PasswordHasher()
    password = hasher.encode(PASSWORD, hasher.salt())
    get_user_model().objects.create(username=username, password=password)


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """One server for the module, on the test database (django_db_setup made it)."""
    tmp_path = tmp_path_factory.mktemp("body-deadline")
    env = environment(
        tmp_path, LAKESHORE_WEB_WORKERS="1", LAKESHORE_BODY_SECONDS=f"{BODY_SECONDS:g}"
    )
    with gunicorn(tmp_path, env) as (base, _):
        yield int(env["PORT"]), base


def login_head(length: int) -> bytes:
    return (
        "POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Cookie: csrftoken={CSRF}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def _status_and_close(reader) -> tuple[bytes, bool]:
    """The status line the server sends, and whether it then closed the connection,
    within twice the deadline ((b"", False): nothing)."""

    async def read():
        line = await reader.readline()
        closed = False
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
            closed = True
        return line.strip(), closed

    try:
        return await asyncio.wait_for(read(), 2 * BODY_SECONDS)
    except TimeoutError:
        return b"", False


async def _open_without_body(port: int):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(login_head(100))  # 100 bytes declared, none sent
    await writer.drain()
    return reader, writer


async def _timed_get(client: httpx.AsyncClient, path: str, headers=None) -> tuple[int, float]:
    started = time.monotonic()
    try:
        response = await client.get(path, headers=headers)
    except httpx.TimeoutException:
        return 0, time.monotonic() - started
    return response.status_code, time.monotonic() - started


async def _stall(port: int, base: str, operator: str):
    """SOCKETS bodiless POSTs at once; meanwhile three reads, each given half the body
    deadline to answer (were the POSTs to hold a thread each, the reads would wait for
    the deadline). The reads' (status, seconds), and each socket's (status line,
    closed)."""
    held = await asyncio.gather(*(_open_without_body(port) for _ in range(SOCKETS)))
    await asyncio.sleep(0.5)  # every head is in: under the old bridge, every thread taken
    async with httpx.AsyncClient(base_url=base, timeout=BODY_SECONDS / 2) as client:
        reads = await asyncio.gather(
            _timed_get(client, "/healthz"),
            _timed_get(client, "/login/"),
            _timed_get(client, "/api/v1/queues/", {"Authorization": f"Bearer {operator}"}),
        )
    answers = await asyncio.gather(*(_status_and_close(reader) for reader, _ in held))
    for _, writer in held:
        writer.close()
    return reads, answers


def test_300_bodiless_posts_at_once_leave_the_pages_and_the_api_answering(server):
    port, base = server
    operator = builders.token("operator")
    connection.close()
    reads, answers = builders.run_async(_stall(port, base, operator))
    print(f"\n{SOCKETS} bodiless POSTs held: reads answered in {[f'{t:.2f} s' for _, t in reads]}")
    assert [status for status, _ in reads] == [200, 200, 200], reads
    assert max(seconds for _, seconds in reads) < BODY_SECONDS / 2, reads
    # and every bodiless POST got its 408 at the deadline, its connection closed
    assert answers == [(b"HTTP/1.1 408 Request Timeout", True)] * SOCKETS


async def _lone(port: int) -> tuple[bytes, bytes, float]:
    """One bodiless POST: (status line, the rest of the answer, seconds to the close)."""
    reader, writer = await _open_without_body(port)
    started = time.monotonic()
    try:
        answer = await asyncio.wait_for(reader.read(), 2 * BODY_SECONDS)
    finally:
        writer.close()
    line, _, rest = answer.partition(b"\r\n")
    return line, rest, time.monotonic() - started


def test_a_lone_bodiless_post_gets_408_at_the_deadline(server):
    port, _ = server
    line, rest, took = builders.run_async(_lone(port))
    assert line == b"HTTP/1.1 408 Request Timeout"
    assert f"did not arrive within {BODY_SECONDS:g} s".encode() in rest
    assert b"connection: close" in rest.lower()
    assert BODY_SECONDS - 0.2 <= took < 2 * BODY_SECONDS  # at the deadline, not for good


async def _past_the_limit(port: int, operator: str) -> tuple[bytes, float]:
    """An API write declaring 20 MiB and sending none of it: (its answer, seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    try:
        writer.write(
            (
                "POST /api/v1/queues/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {operator}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {20 * 1024 * 1024}\r\n\r\n"
            ).encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BODY_SECONDS + 10)
        took = time.monotonic() - started
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return head + await reader.readexactly(length), took
    finally:
        writer.close()


def test_a_body_past_the_limit_is_refused_before_it_is_received(server):
    """Django's limit (10 MiB) holds at receive time: 413 from the declared length, at
    once, not a 408 after waiting for 20 MiB."""
    port, _ = server
    operator = builders.token("operator")
    connection.close()
    answer, took = builders.run_async(_past_the_limit(port, operator))
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert answer.endswith(b"}") and b'"code":"too_large"' in answer
    assert took < BODY_SECONDS


async def _refused_token_without_body(port: int) -> tuple[bytes, float]:
    """A bodiless POST to /login/ with a bad bearer token: (its status line, seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    try:
        writer.write(login_head(100).replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer x\r\n\r\n"))
        line = await asyncio.wait_for(reader.readline(), BODY_SECONDS + 10)
        return line.strip(), time.monotonic() - started
    finally:
        writer.close()


def test_a_refused_tokens_body_is_not_waited_for(server):
    """Its body is not received (the token first, as issue 17 has it): Django answers
    at once without it; here the CSRF check, which finds no form, refuses."""
    port, _ = server
    line, took = builders.run_async(_refused_token_without_body(port))
    assert line == b"HTTP/1.1 403 Forbidden"
    assert took < BODY_SECONDS


async def _slow_login(port: int, username: str, pieces: int, every: float) -> bytes:
    """A console login whose form comes in `pieces`, `every` seconds apart: the answer's
    head."""
    form = f"csrfmiddlewaretoken={CSRF}&username={username}&password={PASSWORD}".encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(login_head(len(form)))
        size = -(-len(form) // pieces)
        for start in range(0, len(form), size):
            await asyncio.sleep(every)
            writer.write(form[start : start + size])
            await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    finally:
        writer.close()


def test_the_control_a_body_slow_but_within_the_deadline_is_served(server):
    """The form in 3 pieces over 3 s (the deadline is 12 s): logged in, sent home."""
    port, _ = server
    server_user("slow-body")
    connection.close()
    head = builders.run_async(_slow_login(port, "slow-body", pieces=3, every=1.0))
    assert head.startswith(b"HTTP/1.1 302 ")
    assert b"\r\nlocation: /\r\n" in head.lower()
    assert b"sessionid=" in head
