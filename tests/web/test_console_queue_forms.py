"""The console's queue forms: /queues/add/ and /queues/<name>/edit/ take the API's
fields, go through the API's serializer and the same services, and show each refusal
at its field. Operators only."""

import re

import pytest
from django.contrib.auth import get_user_model

from accounts.roles import grant
from queues import services
from queues.models import Queue
from tests.support import builders

pytestmark = pytest.mark.django_db


def _login(client, role):
    user = get_user_model().objects.create_user(f"{role}-user", password="pw-for-tests-only")
    grant(user, role)
    client.force_login(user)
    return client


@pytest.fixture
def operator(client):
    return _login(client, "operator")


@pytest.fixture
def viewer(client):
    return _login(client, "viewer")


def field_errors(body: str, name: str) -> str:
    """The error text shown with the field named `name` (its ul, by Django's id)."""
    match = re.search(rf'<ul class="[^"]*" id="id_{re.escape(name)}_error">(.*?)</ul>', body, re.S)
    return re.sub(r"<[^>]+>", " ", match.group(1)).strip() if match else ""


def form_names(body: str) -> set[str]:
    fields = re.findall(r'<(?:input|select|textarea)\b[^>]*\sname="([^"]+)"', body)
    return set(fields) - {"csrfmiddlewaretoken"}


def create_form(**fields) -> dict:
    form = {
        "name": "",
        "kind": "fifo",
        "description": "",
        "provider": "",
        "elasticity.kind": "",
        "elasticity.min": "",
        "elasticity.max": "",
        "elasticity.threshold": "",
        "max_depth": "",
        "on_full": "reject",
        "temperature": "1.0",
        "instance_type": "",
        "image_id": "",
        "runner": "",
    }
    form.update(fields)
    return form


# ---------------------------------------------------------------------------- create


def test_the_create_form_has_the_apis_field_names(operator):
    body = operator.get("/queues/add/").content.decode()
    names = form_names(body)
    assert names == set(create_form())


def test_an_operator_adds_a_queue(operator):
    builders.provider(name="here")
    response = operator.post(
        "/queues/add/",
        create_form(
            name="training-h100",
            kind="priority",
            description="h100 prod",
            provider="here",
            **{
                "elasticity.kind": "pool_with_threshold",
                "elasticity.min": "1",
                "elasticity.max": "4",
                "elasticity.threshold": "0.5",
            },
            max_depth="100",
            on_full="block",
        ),
    )

    assert response.status_code == 302 and response["Location"] == "/queues/training-h100/"
    queue = Queue.objects.get(name="training-h100")
    assert (queue.kind, queue.description, queue.provider.name) == ("priority", "h100 prod", "here")
    assert queue.elasticity == {"kind": "pool_with_threshold", "min": 1, "max": 4, "threshold": 0.5}
    assert (queue.max_depth, queue.on_full, queue.temperature) == (100, "block", 1.0)
    page = operator.get(response["Location"]).content.decode()
    assert "Queue &#x27;training-h100&#x27; added." in page
    assert "added." not in operator.get(response["Location"]).content.decode()  # shown once


def test_a_plain_queue_needs_only_a_name(operator):
    response = operator.post("/queues/add/", {"name": "plain"})
    assert response.status_code == 302
    queue = Queue.objects.get(name="plain")
    assert (queue.kind, queue.elasticity, queue.max_depth, queue.temperature) == (
        "fifo",
        None,
        None,
        1.0,
    )


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"name": "Bad Name"}, "name", "Use lower-case letters"),
        ({"name": ""}, "name", "may not be blank"),
        ({"name": "q", "max_depth": "0"}, "max_depth", "greater than or equal to 1"),
        ({"name": "q", "max_depth": "many"}, "max_depth", "valid integer"),
        ({"name": "q", "temperature": "0"}, "temperature", "greater than 0"),
        ({"name": "q", "kind": "lifo"}, "kind", "not a valid choice"),
        # the services' rules (DomainError.fields), at their fields too
        ({"name": "q", "provider": "nowhere"}, "provider", "unknown provider 'nowhere'"),
        (
            {"name": "q", "elasticity.kind": "pool_with_threshold", "elasticity.threshold": "2"},
            "elasticity.threshold",
            "threshold must be in (0, 1]",
        ),
        (
            {"name": "q", "elasticity.kind": "fixed"},
            "elasticity.min",
            "fixed elasticity needs min",
        ),
        ({"name": "q", "elasticity.max": "3"}, "elasticity.kind", "required"),
        ({"name": "q", "temperature": "0.5"}, "temperature", "has no temperature"),
    ],
)
def test_a_bad_value_is_refused_at_its_field_and_nothing_is_created(
    operator, fields, field, message
):
    response = operator.post("/queues/add/", create_form(**fields))

    body = response.content.decode()
    assert response.status_code == 400
    assert message in field_errors(body, field).replace("&#x27;", "'"), body
    assert 'aria-invalid="true"' in body
    assert 'role="alert"' in body
    assert not Queue.objects.exists()
    # what was typed is kept
    if fields.get("name"):
        assert f'value="{fields["name"]}"' in body


def test_a_name_in_use_is_refused_at_the_name(operator):
    builders.queue(name="train", description="the first")
    response = operator.post("/queues/add/", create_form(name="train", description="another"))

    body = response.content.decode()
    assert response.status_code == 409
    assert "already exists" in field_errors(body, "name")
    assert "Queue &#x27;train&#x27; already exists." in body
    assert Queue.objects.get(name="train").description == "the first"


# ---------------------------------------------------------------------------- edit


def test_the_edit_form_shows_only_what_patch_accepts(operator):
    builders.queue(name="train", description="old")
    body = operator.get("/queues/train/edit/").content.decode()
    names = form_names(body)
    # no name, kind or state; no elasticity numbers without elasticity; no temperature
    # on a fifo queue
    assert names == {
        "description",
        "provider",
        "max_depth",
        "on_full",
        "instance_type",
        "image_id",
        "runner",
    }
    assert 'value="old"' in body


def test_the_edit_form_of_an_elastic_boltzmann_queue_has_its_numbers(operator):
    builders.queue(
        name="train",
        kind="boltzmann",
        temperature=2.0,
        elasticity_spec={"kind": "fully_elastic", "min": 1, "max": 5},
    )
    body = operator.get("/queues/train/edit/").content.decode()
    for name in ("elasticity.min", "elasticity.max", "elasticity.threshold", "temperature"):
        assert f'name="{name}"' in body
    assert 'name="elasticity.kind"' not in body
    assert 'value="2.0"' in body and 'value="5"' in body


def test_an_operator_edits_a_queue(operator):
    builders.provider(name="here")
    builders.queue(
        name="train",
        description="old",
        max_depth=10,
        elasticity_spec={"kind": "pool_with_threshold", "min": 1, "max": 4, "threshold": 0.5},
    )
    form = operator.get("/queues/train/edit/")
    assert form.status_code == 200

    response = operator.post(
        "/queues/train/edit/",
        {
            "description": "new",
            "provider": "here",
            "elasticity.min": "1",
            "elasticity.max": "8",
            "elasticity.threshold": "0.5",
            "max_depth": "",
            "on_full": "reject",
            "instance_type": "",
            "image_id": "",
            "runner": "",
        },
    )

    assert response.status_code == 302 and response["Location"] == "/queues/train/"
    queue = Queue.objects.get(name="train")
    assert (queue.description, queue.provider.name, queue.max_depth) == ("new", "here", None)
    assert queue.elasticity == {"kind": "pool_with_threshold", "min": 1, "max": 8, "threshold": 0.5}
    page = operator.get("/queues/train/").content.decode()
    assert "saved (description, provider, max_depth, elasticity.max)" in page


def test_an_edit_sends_only_what_changed(operator, monkeypatch):
    seen = []
    real = services.queue_patch
    monkeypatch.setattr(
        services, "queue_patch", lambda **kw: seen.append(kw["changes"]) or real(**kw)
    )
    builders.queue(name="train", description="old", max_depth=10)
    unchanged = {
        "description": "old",
        "provider": "",
        "max_depth": "10",
        "on_full": "reject",
        "instance_type": "",
        "image_id": "",
        "runner": "",
    }

    assert operator.post("/queues/train/edit/", unchanged).status_code == 302
    assert seen == []
    assert "Nothing to save" in operator.get("/queues/train/").content.decode()

    assert operator.post("/queues/train/edit/", {**unchanged, "runner": "r1"}).status_code == 302
    assert seen == [{"runner": "r1"}]


def test_a_refused_edit_shows_at_the_field_and_changes_nothing(operator):
    builders.queue(name="train", elasticity_spec={"kind": "fixed", "min": 2}, description="old")
    form = {
        "description": "new",
        "provider": "",
        "elasticity.min": "2",
        "elasticity.max": "5",
        "elasticity.threshold": "",
        "max_depth": "",
        "on_full": "reject",
        "instance_type": "",
        "image_id": "",
        "runner": "",
    }

    response = operator.post("/queues/train/edit/", form)

    body = response.content.decode()
    assert response.status_code == 400
    assert "fixed elasticity does not use max" in field_errors(body, "elasticity.max")
    queue = Queue.objects.get(name="train")
    assert (queue.description, queue.elasticity_max) == ("old", None)


def test_editing_an_unknown_queue_is_a_404(operator):
    response = operator.get("/queues/nope/edit/")
    assert response.status_code == 404
    assert "Queue &#x27;nope&#x27; does not exist." in response.content.decode()
    assert operator.post("/queues/nope/edit/", {"description": "x"}).status_code == 404


# ---------------------------------------------------------------------------- roles


@pytest.mark.parametrize("url", ["/queues/add/", "/queues/train/edit/"])
def test_a_viewer_gets_the_403_page_and_changes_nothing(viewer, url):
    builders.queue(name="train", description="old")
    for response in (viewer.get(url), viewer.post(url, create_form(name="x", description="new"))):
        body = response.content.decode()
        assert response.status_code == 403
        assert "needs the <strong>operator</strong> role" in body
        assert "--role operator" in body
    assert list(Queue.objects.values_list("name", "description")) == [("train", "old")]


@pytest.mark.parametrize("url", ["/queues/add/", "/queues/train/edit/"])
def test_a_visitor_is_sent_to_log_in(client, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_a_viewer_sees_no_new_or_edit_links(viewer):
    builders.queue(name="train")
    assert "/queues/add/" not in viewer.get("/").content.decode()
    assert "/queues/train/edit/" not in viewer.get("/queues/train/").content.decode()


def test_an_operator_sees_the_new_and_edit_links(operator):
    builders.queue(name="train")
    assert 'href="/queues/add/">New queue</a>' in operator.get("/").content.decode()
    assert 'href="/queues/train/edit/"' in operator.get("/queues/train/").content.decode()


def test_other_methods_are_refused(operator):
    builders.queue(name="train")
    assert operator.delete("/queues/add/").status_code == 405
    assert operator.put("/queues/train/edit/").status_code == 405


def test_runner_is_a_choice_and_a_queue_keeps_a_value_of_its_own(operator):
    page = operator.get("/queues/add/").content.decode()
    runner = re.search(r'<select name="runner".*?</select>', page, flags=re.S).group(0)
    assert re.findall(r'<option value="([^"]*)"', runner) == ["", "pool", "process"]
    builders.queue(name="train", runner="legacy-runner")
    edit = operator.get("/queues/train/edit/").content.decode()
    runner = re.search(r'<select name="runner".*?</select>', edit, flags=re.S).group(0)
    assert '<option value="legacy-runner" selected>legacy-runner</option>' in runner
