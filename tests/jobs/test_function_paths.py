"""What `function` a submit accepts: a public dotted path. A private or dunder part
(`os._exit`, `a.__class__.b`) is refused at the door, whatever the daemon would say."""

import pytest

from jobs.models import Invocation
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"


def submit(client, function):
    return client.post(URL, {"function": function}, format="json")


@pytest.mark.parametrize(
    "function",
    [
        "lakeshore.functions.echo",
        "os.system",  # a public path: the daemon's allowed modules decide, not the submit
        "pkg.mod_2.run_it",
        "a.b_",
        "Pkg.Mod.Fn",
    ],
)
def test_it_accepts_a_public_dotted_path(operator, function):
    response = submit(operator, function)

    assert response.status_code == 201, response.json()
    assert response.json()["function"] == function


@pytest.mark.parametrize(
    "function, private",
    [
        ("_x", "'_x'"),
        ("__getattribute__", "'__getattribute__'"),
        ("os._exit", "'_exit'"),
        ("a.__class__.b", "'__class__'"),
        ("lakeshore.functions.__builtins__", "'__builtins__'"),
        ("_private.module.fn", "'_private'"),
        ("pkg._internal.fn", "'_internal'"),
    ],
)
def test_it_refuses_a_private_or_dunder_part_and_says_why(operator, function, private):
    response = submit(operator, function)

    error = assert_error(
        response, 400, "invalid", field="function", says=["private or dunder", private]
    )
    assert "'_'" in error["fields"]["function"]
    assert not Invocation.objects.exists()


@pytest.mark.parametrize(
    "function",
    ["echo", "a..b", "a.b.", ".a.b", "a b.c", "1a.b", "a.1b", "a.b-c", "a.b()", ""],
)
def test_it_keeps_the_dotted_path_rule(operator, function):
    response = submit(operator, function)

    assert_error(response, 400, "invalid", field="function")
    assert not Invocation.objects.exists()


def test_a_batch_with_one_private_path_submits_nothing(operator):
    response = operator.post(
        URL,
        [{"function": "lakeshore.functions.echo"}, {"function": "os._exit"}],
        format="json",
    )

    assert_error(response, 400, "invalid", field="function", says="'_exit'")
    assert not Invocation.objects.exists()
