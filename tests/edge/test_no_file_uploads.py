"""Issue 29, item 2, under any server: the web server refuses a multipart body before
reading it (tests/edge/test_multipart_refused.py), and Django itself stores no
file part (DATA_UPLOAD_MAX_NUMBER_FILES = 0): a multipart form with a file is refused
400 at its first file part, before the file's bytes reach an upload handler. The
control: the same form without the file is read (a login). Through Django's WSGI
handler (the test client), which no ASGI door stands in front of."""

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

pytestmark = [pytest.mark.django_db, pytest.mark.security]

PASSWORD = "pw-for-tests-only"


@pytest.fixture
def client():
    get_user_model().objects.create_user("uploader", password=PASSWORD)
    return Client()


def test_a_form_with_a_file_part_is_refused(client, tmp_path, settings):
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path)
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 0  # any file would go to a temporary file
    form = {
        "username": "uploader",
        "password": PASSWORD,
        "upload": SimpleUploadedFile("big.bin", b"x" * 1024 * 1024),
    }
    response = client.post("/login/", form)  # the test client posts multipart
    assert response.status_code == 400
    assert "_auth_user_id" not in client.session
    assert list(tmp_path.iterdir()) == []


def test_the_control_the_same_form_without_a_file_is_read(client):
    response = client.post("/login/", {"username": "uploader", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/"
    assert "_auth_user_id" in client.session
