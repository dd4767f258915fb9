"""A client lets an idle kept-alive connection go before the server closes it
(lakeshore_admin/gunicorn_conf.py): a request sent on a connection the server is
closing at that moment fails (the Python SDK's calls raise; a daemon would log the
server as unreachable and retry). The CLI's and the daemon's client
(lakeshore/client.py) lets go after 4 s, httpx's default (the SDK's) after 5 s, and
the server keeps one 20 s. Against `make run`'s own server."""

import time

import httpx
import pytest

from lakeshore.client import KEEPALIVE_EXPIRY, Client
from lakeshore_admin import gunicorn_conf
from tests.support.servers import environment, gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _client_port(response) -> int:
    """The client's end of the connection the response came on."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def test_an_idle_connection_is_let_go_before_the_server_closes_it(tmp_path):
    server_keeps = gunicorn_conf.keepalive
    assert server_keeps >= 2 * max(KEEPALIVE_EXPIRY, httpx.Limits().keepalive_expiry)
    with gunicorn(tmp_path, environment(tmp_path, LAKESHORE_WEB_WORKERS="1")) as (base, _):
        client = Client(base, token=None)
        first = _client_port(client.send("GET", f"{base}/healthz"))
        # the control: a connection idle a second is used again (keep-alive works)
        time.sleep(1)
        again = _client_port(client.send("GET", f"{base}/healthz"))
        assert again == first
        # idle past the client's expiry, still within the server's: a new connection
        time.sleep(KEEPALIVE_EXPIRY + 1)
        later = client.send("GET", f"{base}/healthz")
        assert later.status_code == 200
        assert _client_port(later) != again
