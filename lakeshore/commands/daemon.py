"""`lakeshore daemon list|show|exec` (`run` and `remove` come with the daemon protocol)."""

import click

from lakeshore.client import Client, path
from lakeshore.context import pass_client
from lakeshore.output import DEFAULT_QUEUE_LABEL, emit, fields, json_option, table, when

DAEMON_STATES = ["provisioning", "idle", "busy", "draining", "terminated", "lost"]


def daemon_queues(daemon: dict) -> str:
    """A daemon's queues; `[]` is the default queue, which has no name."""
    return ",".join(daemon.get("queues") or []) or DEFAULT_QUEUE_LABEL


def daemon_rows(daemons: list[dict], *, with_provider: bool = True) -> list[list]:
    return [
        [d["id"], d.get("name"), d.get("state"), daemon_queues(d)]
        + ([d.get("provider")] if with_provider else [])
        + [when(d.get("last_heartbeat_at"))]
        for d in daemons
    ]


def print_daemons(daemons: list[dict], *, with_provider: bool = True) -> None:
    headers = ["ID", "NAME", "STATE", "QUEUES"]
    headers += ["PROVIDER"] if with_provider else []
    table(headers + ["LAST HEARTBEAT"], daemon_rows(daemons, with_provider=with_provider))


@click.group()
def daemon() -> None:
    """Daemons: the workers that claim and run invocations."""


@daemon.command("list")
@click.option("--queue", metavar="NAME", help="Only daemons subscribed to this queue.")
@click.option("--state", type=click.Choice(DAEMON_STATES), help="Only daemons in this state.")
@json_option
@pass_client
def list_(client: Client, queue: str | None, state: str | None, as_json: bool) -> None:
    """List daemons."""
    daemons = client.get_all("daemons/", queue=queue, state=state)
    if not daemons and not as_json:
        click.echo("No daemons found.", err=True)
        return
    emit(daemons, as_json, print_daemons)


@daemon.command()
@click.argument("daemon_id", metavar="ID")
@json_option
@pass_client
def show(client: Client, daemon_id: str, as_json: bool) -> None:
    """Show one daemon."""
    emit(client.get(path("daemons", daemon_id)), as_json, _print_daemon)


def _print_daemon(d: dict) -> None:
    fields(
        [
            ("ID", d["id"]),
            ("Name", d.get("name")),
            ("State", d.get("state")),
            ("Queues", daemon_queues(d)),
            ("Provider", d.get("provider")),
            ("Instance type", d.get("instance_type")),
            ("External id", d.get("external_id")),
            ("Log", d.get("log_path")),
            ("Current invocation", d.get("current_invocation")),
            ("Last heartbeat", when(d.get("last_heartbeat_at"))),
            ("Created", when(d.get("created_at"))),
        ]
    )


EXEC_SIGNALS = ["TERM", "INT", "KILL"]


@daemon.command("exec")
@click.argument("daemon_id", metavar="DAEMON")
@click.argument("verb", type=click.Choice(["kill", "signal"]))
@click.argument("job", metavar="JOB")
@click.argument(
    "sig",
    metavar="[TERM|INT|KILL]",
    required=False,
    type=click.Choice(EXEC_SIGNALS, case_sensitive=False),
)
@json_option
@pass_client
def exec_(client: Client, daemon_id: str, verb: str, job: str, sig, as_json: bool) -> None:
    """Stop a running job on its daemon (operators).

    \b
      lakeshore daemon exec DAEMON kill JOB          SIGKILL to the job's processes
      lakeshore daemon exec DAEMON signal JOB TERM   TERM (or INT), then KILL after 10 s

    The job ends killed at once, with the reason and who asked; the daemon stops its
    processes at its next heartbeat. Only these verbs exist."""
    if verb == "signal" and sig is None:
        raise click.UsageError("signal needs a signal: TERM, INT or KILL")
    if verb == "kill" and sig is not None and sig.upper() != "KILL":
        raise click.UsageError("kill always sends KILL: use 'signal JOB TERM' for another")
    body = {"verb": verb, "job": job}
    if verb == "signal":
        body["signal"] = sig.upper()
    answer = client.post(path("daemons", daemon_id, "exec"), json=body)

    def human(a):
        click.echo(
            f"job/{a['invocation']} killed on daemon {a['daemon']} ({a['verb']}: "
            f"SIG{a['signal']}); the daemon stops its processes at its next heartbeat"
        )

    emit(answer, as_json, human)
