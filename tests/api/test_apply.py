"""POST /api/v1/apply/ and GET /api/v1/export/ — `lakeshore apply -f lakeshore.yaml` and
`lakeshore export`."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import AuditEvent
from fleet.models import Provider
from queues.models import Queue
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

APPLY = "/api/v1/apply/"
EXPORT = "/api/v1/export/"
POOL = {"kind": "pool_with_threshold", "min": 1, "max": 4, "threshold": 0.5}


def apply(client, document, **options):
    return client.post(APPLY, {"document": document, **options}, format="json")


def actions(response) -> dict[str, str]:
    assert response.status_code == 200, response.json()
    return {f"{i['type']}/{i['name']}": i["action"] for i in response.json()["items"]}


def rows() -> tuple:
    """Everything an apply could change, to show that it did not."""
    return (
        sorted(Provider.objects.values_list("name", "kind", "description", "config")),
        sorted(
            Queue.objects.values_list(
                "name", "kind", "description", "provider__name", "elasticity_max"
            )
        ),
        AuditEvent.objects.count(),
    )


def here_and_train() -> dict:
    return {
        "providers": [{"name": "here", "kind": "simulated"}],
        "queues": [{"name": "train", "kind": "fifo", "provider": "here", "elasticity": POOL}],
    }


# --- plan and apply ---------------------------------------------------------------------------


def test_a_dry_run_plans_the_creates_and_changes_nothing(operator):
    before = rows()

    response = apply(operator, here_and_train(), dry_run=True)

    assert actions(response) == {"provider/here": "create", "queue/train": "create"}
    body = response.json()
    assert (body["applied"], body["up_to_date"], body["dry_run"]) == (False, False, True)
    train = body["items"][1]["changes"]
    assert train["elasticity.max"] == {"old": None, "new": 4}
    assert train["provider"] == {"old": None, "new": "here"}
    assert rows() == before


def test_it_creates_providers_then_the_queues_that_name_them(operator):
    response = apply(operator, here_and_train())

    assert actions(response) == {"provider/here": "create", "queue/train": "create"}
    assert response.json()["applied"] is True
    train = Queue.objects.select_related("provider").get(name="train")
    assert (train.provider.name, train.elasticity) == ("here", POOL)
    assert train.kind == "fifo" and train.on_full == "reject"  # defaults where not given
    audit = AuditEvent.objects.exclude(action="token.create").order_by("id")
    assert list(audit.values_list("action", "target")) == [
        ("provider.create", "provider here"),
        ("queue.create", "queue train"),
    ]


def test_it_updates_only_what_changed_and_leaves_out_what_the_file_leaves_out(operator):
    builders.provider(name="here")
    builders.queue(
        name="train",
        provider="here",
        description="a",
        elasticity_spec=POOL,
        instance_type="p4d.24xlarge",
        max_depth=100,
    )
    builders.queue(name="eval", kind="priority", description="urgent first")
    document = {
        "providers": [{"name": "here", "kind": "simulated", "config": {}}],
        "queues": [
            {
                "name": "train",
                "description": "b",
                "elasticity": {**POOL, "max": 8},
                "max_depth": 100,
            },
            {"name": "eval"},
        ],
    }

    response = apply(operator, document)

    assert actions(response) == {
        "provider/here": "unchanged",
        "queue/train": "update",
        "queue/eval": "unchanged",
    }
    assert response.json()["items"][1]["changes"] == {
        "description": {"old": "a", "new": "b"},
        "elasticity.max": {"old": 4, "new": 8},
    }
    train = Queue.objects.get(name="train")
    assert (train.description, train.elasticity_max) == ("b", 8)
    assert (train.instance_type, train.provider.name) == ("p4d.24xlarge", "here")  # not in file
    assert Queue.objects.get(name="eval").description == "urgent first"
    patch = AuditEvent.objects.get(action="queue.patch")  # what changed, not all it was given
    assert patch.detail["elasticity"] == {"max": 8}
    assert "max_depth" not in patch.detail and patch.detail["description"] == "b"


def test_a_providers_config_is_replaced_whole_and_audited(operator):
    builders.provider(name="here", kind="local", config={"concurrency": 2})

    response = apply(operator, {"providers": [{"name": "here", "kind": "local", "config": {}}]})

    assert actions(response) == {"provider/here": "update"}
    assert response.json()["items"][0]["changes"] == {
        "config": {"old": {"concurrency": 2}, "new": {}}
    }
    assert Provider.objects.get(name="here").config == {}
    assert AuditEvent.objects.filter(action="provider.patch", target="provider here").exists()


def test_the_same_file_applied_again_is_up_to_date_and_records_nothing(operator):
    assert apply(operator, here_and_train()).status_code == 200
    audited = AuditEvent.objects.count()

    again = apply(operator, here_and_train())

    assert set(actions(again).values()) == {"unchanged"}
    assert again.json()["up_to_date"] is True and again.json()["applied"] is False
    assert AuditEvent.objects.count() == audited
    assert apply(operator, here_and_train(), dry_run=True).json()["up_to_date"] is True


def test_a_value_the_service_works_out_the_same_is_unchanged(operator):
    """min: null on a pool queue is its default, 0, as stored: no change, no audit row."""
    builders.queue(name="train", elasticity_spec={**POOL, "min": 0})
    audited = AuditEvent.objects.count()

    response = apply(operator, {"queues": [{"name": "train", "elasticity": {**POOL, "min": None}}]})

    assert actions(response) == {"queue/train": "unchanged"}
    assert AuditEvent.objects.count() == audited


# --- refusals: nothing applied ----------------------------------------------------------------


def test_a_hyphenated_elasticity_kind_is_refused_naming_the_underscored_one(operator):
    document = here_and_train()
    document["queues"].append(
        {"name": "batch", "elasticity": {"kind": "pool-with-threshold", "threshold": 0.5}}
    )
    before = rows()

    response = apply(operator, document)

    error = assert_error(response, 400, "invalid", field="queues[1].elasticity.kind")
    assert "'pool_with_threshold'" in error["fields"]["queues[1].elasticity.kind"]
    assert rows() == before  # not even the provider and the good queue
    assert_error(apply(operator, document, dry_run=True), 400, "invalid")


@pytest.mark.parametrize(
    "change, path, says",
    [
        (
            {"kind": "priority"},
            "queues[0].kind",
            "queue train: kind cannot change (fifo → priority)",
        ),
        (
            {"elasticity": {"kind": "fixed", "min": 2}},
            "queues[0].elasticity.kind",
            "queue train: elasticity kind cannot change (pool_with_threshold → fixed)",
        ),
        (
            {"elasticity": None},
            "queues[0].elasticity",
            "queue train: elasticity kind cannot change (pool_with_threshold → none)",
        ),
    ],
)
def test_what_patch_cannot_change_is_refused_and_nothing_applied(operator, change, path, says):
    builders.provider(name="here")
    builders.queue(name="train", provider="here", elasticity_spec=POOL)
    document = {
        "providers": [{"name": "here", "kind": "simulated", "description": "new text"}],
        "queues": [{"name": "train", "description": "new text", **change}],
    }
    before = rows()

    response = apply(operator, document)

    error = assert_error(response, 400, "invalid", field=path, says=[says, "re-create"])
    assert "remove and re-create it" in error["fields"][path]
    assert rows() == before


def test_a_providers_kind_cannot_change(operator):
    builders.provider(name="here", kind="simulated")

    response = apply(operator, {"providers": [{"name": "here", "kind": "local"}]})

    assert_error(
        response,
        400,
        "invalid",
        field="providers[0].kind",
        says="provider here: kind cannot change (simulated → local)",
    )
    assert Provider.objects.get(name="here").kind == "simulated"


def test_unknown_keys_and_twice_declared_names_are_refused_by_path(operator):
    error = assert_error(apply(operator, {"queues": [], "volumes": []}), 400, "invalid")
    assert set(error["fields"]) == {"volumes"}
    document = {"queues": [{"name": "a"}, {"name": "b", "colour": "blue", "kind": "lifo"}]}
    error = assert_error(apply(operator, document), 400, "invalid")
    assert set(error["fields"]) == {"queues[1].colour"}
    assert "unknown field" in error["fields"]["queues[1].colour"]

    twice = {"queues": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}
    error = assert_error(apply(operator, twice), 400, "invalid", field="queues[2].name")
    assert "queues[0]" in error["fields"]["queues[2].name"]
    assert not Queue.objects.exists()


def test_a_failure_in_the_last_item_leaves_the_first_ones_unapplied(operator):
    builders.queue(name="keep", description="old")
    document = {
        "providers": [{"name": "here", "kind": "simulated"}],
        "queues": [
            {"name": "keep", "description": "new"},
            {"name": "fresh"},
            {"name": "last", "provider": "nowhere"},
        ],
    }
    before = rows()

    response = apply(operator, document)

    error = assert_error(
        response, 400, "invalid", field="queues[2].provider", says="queue last: unknown provider"
    )
    assert "nowhere" in error["fields"]["queues[2].provider"]
    assert rows() == before
    assert Queue.objects.get(name="keep").description == "old"


def test_a_services_refusal_keeps_its_code_and_gets_the_items_path(operator):
    builders.queue(name="train", elasticity_spec=POOL)

    response = apply(operator, {"queues": [{"name": "train", "elasticity": {**POOL, "min": 9}}]})

    error = assert_error(response, 400, "invalid", field="queues[0].elasticity.min")
    assert "must not exceed max" in error["fields"]["queues[0].elasticity.min"]
    assert Queue.objects.get(name="train").elasticity_min == 1


# --- prune ------------------------------------------------------------------------------------


def test_prune_removes_queues_then_providers_the_file_does_not_declare(operator):
    builders.provider(name="old-cloud")
    builders.queue(name="old", provider="old-cloud")
    builders.provider(name="here")
    builders.queue(name="train", provider="here")
    document = {
        "providers": [{"name": "here", "kind": "simulated"}],
        "queues": [{"name": "train"}],
    }

    plan = apply(operator, document, prune=True, dry_run=True)
    assert actions(plan) == {
        "provider/here": "unchanged",
        "queue/train": "unchanged",
        "queue/old": "delete",
        "provider/old-cloud": "delete",
    }
    assert Queue.objects.filter(name="old").exists()

    assert actions(apply(operator, document, prune=True)) == actions(plan)
    assert sorted(Queue.objects.values_list("name", flat=True)) == ["train"]
    assert sorted(Provider.objects.values_list("name", flat=True)) == ["here"]
    assert AuditEvent.objects.filter(action="queue.remove", queue="old").exists()
    assert apply(operator, document, prune=True).json()["up_to_date"] is True


def test_without_prune_what_the_file_leaves_out_stays(operator):
    builders.queue(name="old")

    assert actions(apply(operator, {"queues": [{"name": "new"}]})) == {"queue/new": "create"}
    assert Queue.objects.filter(name="old").exists()


def refusals(response) -> dict[str, dict | None]:
    """A refused plan (409 apply_refused): each item's refusal, by type/name."""
    assert response.status_code == 409, response.json()
    error = response.json()["error"]
    assert error["code"] == "apply_refused"
    return {f"{i['type']}/{i['name']}": i["refused"] for i in error["items"]}


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_refused_removal_refuses_the_plan_and_the_answer_holds_every_item(operator, dry_run):
    builders.queue(name="busy")
    builders.daemon(queues=["busy"])
    builders.daemon(queues=["busy"])
    builders.queue(name="keep", description="old")
    builders.queue(name="idle")
    document = {"queues": [{"name": "keep", "description": "new"}, {"name": "fresh"}]}
    before = rows()

    response = apply(operator, document, prune=True, dry_run=dry_run)

    found = refusals(response)
    assert list(found) == ["queue/keep", "queue/fresh", "queue/busy", "queue/idle"]
    assert found["queue/busy"]["code"] == "queue_in_use"
    assert "still has 2 bound daemon(s)" in found["queue/busy"]["message"]
    assert (found["queue/keep"], found["queue/fresh"], found["queue/idle"]) == (None,) * 3
    error = response.json()["error"]
    assert [i["action"] for i in error["items"]] == ["update", "create", "delete", "delete"]
    assert error["dry_run"] is dry_run
    assert error["message"] == (
        "1 removal of the plan is refused (queue busy), so nothing was changed (lakeshore "
        "apply --prune never forces: drain the queue first, or remove it by hand with "
        "'lakeshore queues rm NAME --force')."
    )
    assert rows() == before
    assert Queue.objects.get(name="keep").description == "old"
    assert not Queue.objects.filter(name="fresh").exists()
    assert Queue.objects.filter(name="idle").exists()  # removable, yet not removed


def test_control_when_every_removal_is_allowed_the_plan_is_applied(operator):
    builders.queue(name="idle")
    response = apply(operator, {"queues": [{"name": "fresh"}]}, prune=True)
    assert actions(response) == {"queue/fresh": "create", "queue/idle": "delete"}
    assert [i["refused"] for i in response.json()["items"]] == [None, None]
    assert not Queue.objects.filter(name="idle").exists()


def test_prune_refuses_a_provider_a_declared_queue_still_uses(operator):
    builders.provider(name="here")
    builders.queue(name="train", provider="here")

    response = apply(operator, {"queues": [{"name": "train"}]}, prune=True)

    refused = refusals(response)["provider/here"]
    assert refused["code"] == "provider_in_use"
    assert refused["message"].startswith("Provider 'here' is used by queue(s) train")
    assert "never forces" not in response.json()["error"]["message"]
    assert Provider.objects.filter(name="here").exists()


def test_a_provider_behind_a_refused_queue_is_refused_too(operator):
    """Planned in order: the queue stays, so the provider it uses cannot go either."""
    builders.provider(name="old-cloud")
    builders.queue(name="old", provider="old-cloud")
    builders.daemon(queues=["old"])

    found = refusals(apply(operator, {}, prune=True, dry_run=True))

    assert {name: r["code"] for name, r in found.items()} == {
        "queue/old": "queue_in_use",
        "provider/old-cloud": "provider_in_use",
    }


# --- export -----------------------------------------------------------------------------------


def test_export_writes_every_field_of_every_provider_and_queue(operator):
    builders.provider(name="here", kind="local", config={"concurrency": 2}, description="this host")
    builders.queue(name="train", provider="here", elasticity_spec={"kind": "fixed", "min": 2})
    builders.queue(name="gone", kind="boltzmann", temperature=2.5)
    operator.post("/api/v1/queues/gone/archive/")

    document = operator.get(EXPORT).json()

    assert document["providers"] == [
        {"name": "here", "kind": "local", "description": "this host", "config": {"concurrency": 2}}
    ]
    assert [q["name"] for q in document["queues"]] == ["gone", "train"]  # archived ones too
    train = document["queues"][1]
    assert train == {
        "name": "train",
        "kind": "fifo",
        "description": "",
        "provider": "here",
        "elasticity": {"kind": "fixed", "min": 2},
        "instance_type": "",
        "image_id": "",
        "runner": "",
        "max_depth": None,
        "on_full": "reject",
        "temperature": 1.0,
    }


def test_export_applies_as_up_to_date_before_and_after_changes(operator):
    builders.provider(name="here", kind="local", config={"concurrency": 2})
    builders.queue(name="train", provider="here", elasticity_spec=POOL, max_depth=10)
    builders.queue(name="wide", elasticity_spec={"kind": "fully_elastic"}, on_full="block")
    builders.queue(name="warm", kind="boltzmann", temperature=0.25)

    for change in [
        None,
        ("/api/v1/queues/train/", {"max_depth": None, "elasticity": {"threshold": 0.8}}),
        ("/api/v1/providers/here/", {"config": {"concurrency": 4}, "description": "x"}),
        ("/api/v1/queues/wide/", {"provider": "here", "elasticity": {"max": 3}}),
    ]:
        if change:
            assert operator.patch(*change, format="json").status_code == 200
        exported = operator.get(EXPORT).json()
        plan = apply(operator, exported, dry_run=True, prune=True)
        assert plan.json()["up_to_date"] is True, plan.json()


def test_an_export_re_creates_what_it_describes(operator):
    builders.provider(name="here", kind="simulated", config={"startup_seconds": 3})
    builders.queue(name="train", provider="here", elasticity_spec=POOL, runner="process")
    exported = operator.get(EXPORT).json()
    Queue.objects.all().delete()
    Provider.objects.all().delete()

    assert set(actions(apply(operator, exported)).values()) == {"create"}

    assert operator.get(EXPORT).json() == exported


# --- who may ----------------------------------------------------------------------------------


def test_a_viewer_may_export_but_neither_plan_nor_apply(viewer):
    assert viewer.get(EXPORT).status_code == 200

    for dry_run in (True, False):
        response = apply(viewer, here_and_train(), dry_run=dry_run)
        assert_error(response, 403, "permission_denied", says="operator")
    assert not Queue.objects.exists()


def test_a_daemon_token_gets_nothing(api):
    api.credentials(**builders.auth(builders.token("daemon")))

    assert_error(apply(api, here_and_train(), dry_run=True), 403, "permission_denied")
    assert api.get(EXPORT).status_code == 403


def test_the_schema_documents_apply_and_export(operator):
    schema = operator.get("/api/schema/", {"format": "json"}).json()

    post = schema["paths"]["/api/v1/apply/"]["post"]
    assert {"200", "400", "401", "403", "409"} <= set(post["responses"])
    assert "requestBody" in post
    assert "200" in schema["paths"]["/api/v1/export/"]["get"]["responses"]


def _export_queries(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(EXPORT).status_code == 200
    return len(ctx.captured_queries)


def test_export_costs_the_same_queries_for_1_or_20_providers_and_queues(viewer):
    builders.provider(name="p0", kind="local")
    builders.queue(name="q0", provider="p0")
    _export_queries(viewer)  # the token's first use writes its last_used_at once
    one = _export_queries(viewer)
    for n in range(1, 20):
        builders.provider(name=f"p{n}", kind="local")
        builders.queue(name=f"q{n}", provider=f"p{n}")
    assert _export_queries(viewer) == one
