"""`lakeshore providers …` and `lakeshore daemon list|show` without a server."""

import json

import httpx
import pytest

PROVIDER = {
    "name": "my-gpu-provider",
    "kind": "simulated",
    "description": "",
    "config": {},
    "created_at": "2026-01-02T03:04:05Z",
    "updated_at": "2026-01-02T03:04:05Z",
}


def test_providers_add_sends_name_kind_and_config(fake_api):
    fake_api.on("POST", "providers/", status=201, json=PROVIDER)
    result = fake_api.run(
        "providers", "add", "my-gpu-provider", "--kind", "simulated", "--config", '{"slots": 2}'
    )
    assert (result.exit_code, result.stdout) == (0, "provider/my-gpu-provider created\n")
    assert fake_api.body() == {
        "name": "my-gpu-provider",
        "kind": "simulated",
        "config": {"slots": 2},
    }


@pytest.mark.parametrize("config", ["[1, 2]", "not json", '"text"'])
def test_providers_add_wants_a_json_object_for_config(fake_api, config):
    result = fake_api.run("providers", "add", "p", "--kind", "local", "--config", config)
    assert result.exit_code == 2
    assert "Invalid value for '--config'" in result.stderr
    assert fake_api.requests == []


def test_providers_add_wants_a_known_kind(fake_api):
    assert fake_api.run("providers", "add", "p", "--kind", "aws").exit_code == 2
    assert fake_api.run("providers", "add", "p").exit_code == 2


def test_providers_list_prints_a_table(fake_api):
    fake_api.on("GET", "providers/", json=[{**PROVIDER, "description": "gpus"}])
    result = fake_api.run("providers", "list")
    assert result.stdout.splitlines() == [
        "NAME              KIND        DESCRIPTION",
        "my-gpu-provider   simulated   gpus",
    ]


def test_providers_patch_and_remove(fake_api):
    fake_api.on("PATCH", "providers/p/", json={**PROVIDER, "name": "p"})
    fake_api.run("providers", "patch", "p", "--description", "new")
    assert fake_api.body() == {"description": "new"}
    assert fake_api.run("providers", "patch", "p").exit_code == 2
    fake_api.on("DELETE", "providers/p/", httpx.Response(204))
    assert fake_api.run("providers", "remove", "p").stdout == "provider/p deleted\n"


def test_providers_remove_reports_the_queues_using_it(fake_api):
    message = "Provider 'p' is used by queues: training-h100."
    fake_api.on(
        "DELETE",
        "providers/p/",
        status=409,
        json={"error": {"code": "conflict", "message": message}},
    )
    result = fake_api.run("providers", "remove", "p")
    assert (result.exit_code, result.stderr) == (1, f"error: {message}\n")


DAEMONS = [
    {
        "id": "12",
        "name": "worker-a",
        "queues": [],
        "state": "busy",
        "provider": "local",
        "instance_type": "",
        "current_invocation": "99",
        "last_heartbeat_at": "2026-01-02T03:04:05Z",
        "created_at": "2026-01-02T03:00:00Z",
    },
    {
        "id": "9",
        "name": "worker-b",
        "queues": ["eval", "training-h100"],
        "state": "idle",
        "provider": None,
        "last_heartbeat_at": None,
    },
]


def test_daemon_list_shows_default_for_no_queues(fake_api):
    fake_api.on("GET", "daemons/", json=DAEMONS)
    result = fake_api.run("daemon", "list", "--queue", "eval", "--state", "idle")
    assert result.stdout.splitlines() == [
        "ID   NAME       STATE   QUEUES               PROVIDER   LAST HEARTBEAT",
        "12   worker-a   busy    (default)            local      2026-01-02T03:04:05Z",
        "9    worker-b   idle    eval,training-h100   -          -",
    ]
    assert dict(fake_api.last.url.params) == {"queue": "eval", "state": "idle"}


def test_daemon_show(fake_api):
    fake_api.on("GET", "daemons/12/", json=DAEMONS[0])
    result = fake_api.run("daemon", "show", "12")
    assert "Queues:             (default)" in result.stdout
    assert json.loads(fake_api.run("daemon", "show", "12", "--json").stdout) == DAEMONS[0]
