"""`lakeshore providers list|add|show|patch|remove` (the regular verbs)."""

import json

import click

from lakeshore.client import Client, path
from lakeshore.context import pass_client
from lakeshore.output import echo, emit, fields, json_option, print_json, table, when
from lakeshore.params import JsonOf, check_name, given

KINDS = ["local", "simulated", "slurm"]

config_option = click.option(
    "--config",
    type=JsonOf(dict),
    help="Provider settings as a JSON object (no credentials; the server refuses unknown "
    "keys). local: concurrency (1-64), credential_ref; simulated: startup_seconds (>= 0), "
    "fail (a message every launch fails with), credential_ref; slurm: partition, account, "
    "qos, time_limit, cpus_per_task, mem, gres, constraint, concurrency, instance_types "
    "(a queue's --instance-type → those resources), slurm_conf, credential_ref. "
    'E.g. \'{"concurrency": 2}\' or \'{"partition": "debug"}\'.',
)


@click.group()
def providers() -> None:
    """Providers: the plug-ins that launch and terminate daemons."""


@providers.command("list")
@json_option
@pass_client
def list_(client: Client, as_json: bool) -> None:
    """List providers."""
    found = client.get_all("providers/")
    if not found and not as_json:
        click.echo("No providers found.", err=True)
        return
    emit(found, as_json, _print_providers)


def _print_providers(found: list[dict]) -> None:
    table(
        ["NAME", "KIND", "DESCRIPTION"],
        [[p["name"], p.get("kind"), p.get("description")] for p in found],
    )


@providers.command()
@click.argument("name", metavar="NAME", callback=check_name)
@click.option("--kind", type=click.Choice(KINDS), required=True, help="Which plug-in.")
@click.option("--description", help="Free text.")
@config_option
@json_option
@pass_client
def add(client: Client, name: str, kind: str, description, config, as_json: bool) -> None:
    """Register a provider."""
    body = {"name": name, "kind": kind, **given(description=description, config=config)}
    provider = client.post("providers/", json=body)
    emit(provider, as_json, lambda p: click.echo(f"provider/{p.get('name', name)} created"))


@providers.command()
@click.argument("name", metavar="NAME")
@json_option
@pass_client
def show(client: Client, name: str, as_json: bool) -> None:
    """Show one provider."""
    emit(client.get(path("providers", name)), as_json, _print_provider)


def _print_provider(p: dict) -> None:
    fields(
        [
            ("Name", p["name"]),
            ("Kind", p.get("kind")),
            ("Description", p.get("description")),
            ("Config", json.dumps(p.get("config") or {}, sort_keys=True)),
            ("Created", when(p.get("created_at"))),
            ("Updated", when(p.get("updated_at"))),
        ]
    )
    status = p.get("status") or {}
    if p.get("kind") == "slurm" or "reachable" in status:
        _print_cluster(status)
    if status.get("processes") is not None:
        click.echo("")
        procs = status["processes"]
        click.echo(f"Processes: {sum(1 for p in procs if p.get('running'))} running")
        if procs:
            table(
                ["DAEMON", "PID", "RUNNING"],
                [[p["daemon"], p["pid"], p.get("running")] for p in procs],
            )


def _print_cluster(status: dict) -> None:
    click.echo("")
    if status.get("reachable") is None and "observed_at" in status:
        click.echo("Cluster: not observed yet (the controller's tick asks it)")
        return
    seen = f", observed {when(status['observed_at'])}" if status.get("observed_at") else ""
    if not status.get("reachable"):
        echo(f"Cluster: unreachable: {status.get('error') or 'no answer'}{seen}")
        return
    click.echo(f"Cluster: reachable{seen}")
    partitions = status.get("partitions") or []
    if partitions:
        table(
            ["PARTITION", "AVAIL", "NODES", "STATE", "CPUS (A/I/O/T)"],
            [[r["partition"], r["avail"], r["nodes"], r["state"], r["cpus"]] for r in partitions],
        )
    if status.get("error"):
        echo(f"Jobs: could not list them: {status['error']}")
        return
    jobs = status.get("jobs") or []
    click.echo("")
    if not jobs:
        click.echo("Slurm jobs: none")
        return
    click.echo(f"Slurm jobs: {len(jobs)}")
    table(
        ["JOB", "NAME", "STATE", "REASON", "TIME", "DAEMON"],
        [[j["id"], j["name"], j["state"], j["reason"], j["elapsed"], j["daemon"]] for j in jobs],
    )


@providers.command()
@click.argument("name", metavar="NAME")
@click.option("--description", help="Free text.")
@config_option
@json_option
@pass_client
def patch(client: Client, name: str, description, config, as_json: bool) -> None:
    """Change a provider's description or config."""
    body = given(description=description, config=config)
    if not body:
        raise click.UsageError("nothing to patch: give at least one of --description, --config")
    provider = client.patch(path("providers", name), json=body)
    emit(provider, as_json, lambda p: click.echo(f"provider/{p.get('name', name)} patched"))


@providers.command()
@click.argument("name", metavar="NAME")
@json_option
@pass_client
def remove(client: Client, name: str, as_json: bool) -> None:
    """Delete a provider (refused while a queue uses it)."""
    result = client.delete(path("providers", name))
    if as_json:
        print_json(result if result is not None else {"name": name, "deleted": True})
    else:
        click.echo(f"provider/{name} deleted")
