"""A mistyped API address answers in the API's error shape, like every other error."""

import pytest
from django.test import Client

from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/api/v1/nothing/", "/api/v1/queues/q/bogus/"])
def test_an_unknown_route_answers_a_json_404(operator, url):
    builders.queue(name="q")

    response = operator.get(url)

    assert response["Content-Type"].startswith("application/json")
    assert_error(response, 404, "not_found")


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_a_write_to_an_unknown_route_answers_a_json_404_not_a_csrf_page(method):
    """A script's POST has no CSRF cookie: it must learn the address is wrong, not get
    the CSRF failure page (Django's test client checks CSRF only when told to)."""
    client = Client(enforce_csrf_checks=True)

    response = getattr(client, method)(
        "/api/v1/nothing/", data="{}", content_type="application/json"
    )

    assert response["Content-Type"].startswith("application/json")
    assert_error(response, 404, "not_found")


def test_a_post_to_a_real_route_without_a_token_still_meets_authentication():
    """Negative control: the exemption is the 404's only; a real route still refuses."""
    client = Client(enforce_csrf_checks=True)

    response = client.post("/api/v1/queues/", data="{}", content_type="application/json")

    assert response.status_code == 401
