"""A mistyped API address answers in the API's error shape, like every other error."""

import pytest

from tests import builders
from tests.api.assertions import assert_error

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", ["/api/v1/nothing/", "/api/v1/queues/q/bogus/"])
def test_an_unknown_route_answers_a_json_404(operator, url):
    builders.queue(name="q")

    response = operator.get(url)

    assert response["Content-Type"].startswith("application/json")
    assert_error(response, 404, "not_found")
