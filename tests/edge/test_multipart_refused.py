"""Issue 29, item 2: nothing here takes file uploads, so no body reaches the disk. An
unauthenticated multipart POST to /login/ had Django write a 200 MiB temporary upload
file before its 403 (DATA_UPLOAD_MAX_MEMORY_SIZE does not count file parts). Now a
multipart body is refused with 415 `unsupported_media_type` on every path, before a
byte of it is read (edge/application.py); under any other server Django refuses
its first file part (DATA_UPLOAD_MAX_NUMBER_FILES = 0).

Against `make run`'s server, its temporary directory (TMPDIR) watched while a 200 MiB
multipart body streams in. The control: a login form (urlencoded) still logs in."""

import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tests.edge.test_body_deadline import CSRF, PASSWORD, server_user
from tests.edge.test_token_before_body_server import Sampler, server_rss
from tests.support import builders
from tests.support.servers import environment, gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("memory"),  # measures the server's memory
    pytest.mark.security,
]

MIB = 1024 * 1024
UPLOAD = 200 * MIB
BOUNDARY = "lakeshore-test-boundary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup):
    """One server for the module, its temporary files under its own TMPDIR."""
    tmp_path = tmp_path_factory.mktemp("multipart")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = environment(tmp_path, LAKESHORE_WEB_WORKERS="1", TMPDIR=str(temp))
    with gunicorn(tmp_path, env) as (base, proc):
        yield base, proc, temp


def _form_head(name: str, filename: str) -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; '
        f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()


def multipart(size: int):
    """A multipart form: the CSRF token, then a file part of `size` bytes, in 1 MiB
    pieces (never held whole); its length."""
    token = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="csrfmiddlewaretoken"\r\n\r\n'
        f"{CSRF}\r\n"
    ).encode()
    head, tail = _form_head("upload", "big.bin"), f"\r\n--{BOUNDARY}--\r\n".encode()
    piece = b"x" * MIB

    def chunks():
        yield token + head
        for start in range(0, size, MIB):
            yield piece[: min(MIB, size - start)]
        yield tail

    return chunks, len(token) + len(head) + size + len(tail)


class TempWatcher:
    """The largest total size of the files under `folder`, looked at every 10 ms."""

    def __init__(self, folder: Path):
        self.folder, self.most, self._stop = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _size(self) -> int:
        total = 0
        for path in self.folder.rglob("*"):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def _run(self):
        while not self._stop.is_set():
            self.most = max(self.most, self._size())
            time.sleep(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.most = max(self.most, self._size())


def test_a_200_mib_multipart_post_to_login_is_refused_and_nothing_reaches_the_disk(server):
    base, proc, temp = server
    chunks, length = multipart(UPLOAD)
    baseline = server_rss(proc)
    with TempWatcher(temp) as disk, Sampler(proc) as memory:
        response = httpx.post(
            f"{base}/login/",
            content=chunks(),
            headers={
                "Content-Type": MULTIPART,
                "Content-Length": str(length),
                "Cookie": f"csrftoken={CSRF}",
            },
            timeout=60,
        )
    assert response.status_code == 415
    assert "Multipart bodies are not taken" in response.text
    assert disk.most == 0
    rise = (memory.peak - baseline) / MIB
    print(f"\n200 MiB multipart to /login/: 415; temp files 0 B; server RSS +{rise:.1f} MiB")
    assert rise < 50


def test_a_multipart_body_is_refused_on_every_path(server):
    base, _, _ = server
    operator = builders.token("operator")
    connection.close()
    chunks, length = multipart(1024)
    body = b"".join(chunks())
    headers = {"Content-Type": MULTIPART, "Cookie": f"csrftoken={CSRF}"}
    bearer = {**headers, "Authorization": f"Bearer {operator}"}
    with httpx.Client(base_url=base, timeout=10) as client:
        admin = client.post("/admin/login/", content=body, headers=headers)
        api = client.post("/api/v1/queues/", content=body, headers=bearer)
        sdk = client.post("/v1/namespaces/default/producer/submit", content=body, headers=bearer)
    assert admin.status_code == 415 and "Multipart bodies are not taken" in admin.text
    assert api.status_code == 415
    assert api.json()["error"]["code"] == "unsupported_media_type"
    assert sdk.status_code == 415
    assert sdk.headers["Lakeshore-Error-Code"] == "unsupported_media_type"


def test_the_control_an_urlencoded_login_logs_in(server):
    base, _, temp = server
    server_user("form-login")
    connection.close()
    form = {"csrfmiddlewaretoken": CSRF, "username": "form-login", "password": PASSWORD}
    response = httpx.post(
        f"{base}/login/", data=form, headers={"Cookie": f"csrftoken={CSRF}"}, timeout=10
    )
    assert response.status_code == 302 and response.headers["Location"] == "/"
    assert "sessionid" in response.cookies
    assert list(temp.iterdir()) == []
