"""What the server relies on in its libraries beyond what their documentation promises,
checked directly, so that a release that changes it fails here and names the module
that relies on it: uvicorn's protocol attributes (edge/http_protocol.py) and the
psycopg result under Django's cursor (lakeshore_admin/rows.py). The pins are in
requirements.txt."""

import asyncio

import pytest
from django.db import connection
from uvicorn.config import Config
from uvicorn.server import ServerState

from edge.http_protocol import Protocol
from tests.support import builders

PROTOCOL = ("loop", "transport", "timeout_keep_alive", "timeout_keep_alive_task", "cycle", "scope")
CYCLE = ("more_body", "response_started", "response_complete", "disconnected", "message_event")


class Transport(asyncio.Transport):
    """A connection that keeps what is written to it."""

    def __init__(self):
        super().__init__()
        self.closing = False

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default
        )

    def write(self, data) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope, receive, send):
    await asyncio.sleep(3600)


def test_uvicorns_protocol_has_what_the_edges_protocol_reads():
    async def connect_and_send_a_head() -> list[str]:
        config = Config(app=_app, http="httptools", lifespan="off", log_config=None)
        loop = asyncio.get_running_loop()
        protocol = Protocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        protocol.connection_made(Transport())
        assert protocol.head_deadline is not None  # armed on a new connection
        protocol.data_received(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
        missing = [name for name in PROTOCOL if not hasattr(protocol, name)]
        missing += [f"cycle.{name}" for name in CYCLE if not hasattr(protocol.cycle, name)]
        assert protocol.head_deadline is None  # the head came
        assert protocol.body_deadline is not None  # 7 bytes of the body are still due
        protocol.connection_lost(None)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        return missing

    missing = builders.run_async(connect_and_send_a_head())  # a loop of its own thread
    assert not missing, f"uvicorn no longer sets {missing}: edge/http_protocol.py reads them"


@pytest.mark.django_db
def test_djangos_cursor_gives_psycopgs_result_as_rows_reads_it():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 AS one, 'x' AS two")
        result = cursor.cursor.pgresult  # lakeshore_admin/rows.py reads the names here
        assert result is not None, "Django's cursor no longer wraps psycopg's: rows.py reads it"
        assert [result.fname(i) for i in range(result.nfields)] == [b"one", b"two"]
