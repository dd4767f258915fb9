"""Writes on providers and reads of daemons, for every door (the API, the console,
admin actions, apply): the rules live here once. The daemon lifecycle (register,
heartbeat, drop, leave, lost) is fleet/daemons.py and fleet/registration.py."""

import logging
import re

from django.db import IntegrityError, transaction

from accounts import audit
from fleet import daemons, provider_configs
from fleet.driver_base import ProviderError, driver_for
from fleet.models import Daemon, Provider
from lakeshore_admin.errors import Conflict, Invalid, NotFound
from queues.services import name_list

logger = logging.getLogger("fleet.controller")


def provider_get(name: str) -> Provider:
    try:
        return Provider.objects.get(name=name)
    except Provider.DoesNotExist:
        raise NotFound(f"Provider '{name}' does not exist.") from None


def provider_status(provider: Provider) -> dict:
    """What the provider runs, as read without asking it: for slurm, what the
    controller's tick last observed and when (providers_observe). No read runs a
    subprocess, whoever asks and however often."""
    return driver_for(provider).describe(provider=provider)


def providers_observe(*, now) -> int:
    """The controller's tick, outside any transaction: each provider whose driver has
    something to ask is asked (slurm: sinfo, squeue, each within LAKESHORE_SLURM_TIMEOUT),
    and what it said is stored on its row with the time. A provider that cannot answer
    is stored as a failed observation (reachable false, its error, the time); it never
    stops the tick. Answers how many were observed."""
    observed = 0
    for provider in Provider.objects.order_by("pk"):
        try:
            seen = driver_for(provider).observe_status(provider=provider)
        except Exception as exc:  # noqa: BLE001 - one provider's failure is its own
            error = str(exc)
            if not isinstance(exc, ProviderError):
                logger.exception("observing provider %s failed", provider.name)
                error = f"{type(exc).__name__}: {exc}"
            seen = {"reachable": False, "error": error, "partitions": [], "jobs": []}
        if seen is None:
            continue
        Provider.objects.filter(pk=provider.pk).update(observed=seen, observed_at=now)
        observed += 1
    return observed


_SECRET_WORDS = {
    "secret", "secrets", "password", "passwd", "passphrase", "token", "authorization",
    "credential", "credentials", "cookie", "bearer", "apikey", "pat",
}  # fmt: skip


_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("ssh", "key"),
                 ("secret", "key"), ("client", "secret"), ("signing", "key")}  # fmt: skip


def _looks_secret(key: str) -> bool:
    """Split camelCase, snake_case and kebab-case keys into words and look for the
    words credentials are named with (so 'max_tokens' passes and 'apiKey' does not)."""
    if key.lower() == "credential_ref":
        return False
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", key)]
    pairs = set(zip(words, words[1:], strict=False))
    return bool(set(words) & _SECRET_WORDS or pairs & _SECRET_PAIRS)


def _secret_paths(value, path: str = "config") -> list[str]:
    found = []
    if isinstance(value, dict):
        for key, inner in value.items():
            here = f"{path}.{key}"
            if _looks_secret(str(key)):
                found.append(here)
            found.extend(_secret_paths(inner, here))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found.extend(_secret_paths(inner, f"{path}[{index}]"))
    return found


def check_provider_config(config, kind: str | None = None) -> dict:
    """Refuse credentials (whatever the kind), then, given the provider's kind, anything
    its schema (fleet/provider_configs.py) does not allow: unknown keys, wrong types,
    values out of range, missing required keys."""
    if not isinstance(config, dict):
        raise Invalid("config must be a JSON object.", fields={"config": "not an object"})
    secrets = _secret_paths(config)
    if secrets:
        raise Invalid(
            "Provider config must not hold credentials ("
            + ", ".join(secrets)
            + "): store them outside Lakeshore and name them with 'credential_ref'.",
            fields={path: "credentials are refused" for path in secrets},
        )
    if kind is None:
        return config
    if kind not in provider_configs.SCHEMAS:
        raise Invalid(f"Unknown provider kind '{kind}'.", fields={"kind": "unknown kind"})
    errors = provider_configs.config_errors(kind, config)
    if errors:
        raise Invalid(
            f"Invalid config for a {kind} provider: "
            + "; ".join(f"{path}: {message}" for path, message in errors.items())
            + ".",
            fields=errors,
        )
    return config


def provider_create(*, name: str, kind: str, description: str = "", config=None) -> Provider:
    config = check_provider_config({} if config is None else config, kind)
    provider = Provider(name=name, kind=kind, description=description, config=config)
    try:
        with transaction.atomic():
            provider.save()
    except IntegrityError:
        raise Conflict(
            f"Provider '{name}' already exists.",
            fields={"name": "already exists"},
            code="already_exists",
        ) from None
    audit.record("provider.create", target=f"provider {name}", summary=f"kind {kind}")
    return provider


def provider_patch(*, name: str, changes: dict) -> Provider:
    """A new `config` replaces the old one whole, and is checked against the
    provider's kind like a new provider's."""
    if "name" in changes or "kind" in changes:
        field = "name" if "name" in changes else "kind"
        raise Invalid(
            f"A provider's {field} cannot change: add a new provider.",
            fields={field: "immutable"},
        )
    provider = provider_get(name)
    if "config" in changes:
        provider.config = check_provider_config(changes["config"], provider.kind)
    if "description" in changes:
        provider.description = changes["description"]
    provider.save()
    audit.record(
        "provider.patch",
        target=f"provider {name}",
        summary="changed " + ", ".join(sorted(changes)) if changes else "no change",
    )  # the config's values stay out of the trail
    return provider


def provider_delete(*, name: str) -> None:
    with transaction.atomic():
        provider = provider_get(name)
        queues = list(provider.queues.order_by("name").values_list("name", flat=True))
        if queues:
            raise Conflict(
                f"Provider '{name}' is used by queue(s) {name_list(queues)}: clear it "
                "there first ('lakeshore queues patch NAME --provider \"\"').",
                extra={"queues": queues[:100]},
                code="provider_in_use",
            )
        live = Daemon.objects.live().filter(provider=provider).count()
        if live:
            raise Conflict(
                f"Provider '{name}' still runs {live} live daemon(s): remove them first.",
                code="provider_in_use",
            )
        daemons.revoke_tokens(Daemon.objects.filter(provider=provider))
        Daemon.objects.filter(provider=provider).update(provider=None)
        provider.delete()
        audit.record("provider.remove", target=f"provider {name}", summary="removed")


def daemon_get(daemon_id, *, with_provider: bool = True) -> Daemon:
    """The daemon, or NotFound. The daemon protocol passes with_provider=False: it
    never shows the provider, and the join costs every claim a third of a millisecond."""
    try:
        pk = int(daemon_id)
        daemon = Daemon.objects.for_list().get(pk=pk) if with_provider else Daemon.objects.by_pk(pk)
    except (Daemon.DoesNotExist, ValueError, TypeError, OverflowError):
        daemon = None
    if daemon is None:
        raise NotFound(f"Daemon '{daemon_id}' does not exist.")
    return daemon
