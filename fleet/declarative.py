"""lakeshore.yaml: providers and queues declared in a file, planned against what exists
and applied in one transaction through the services every other door uses
(queues/services.py, fleet/services.py): they validate, enforce every rule and record
the audit trail.

The document (parsed by fleet.api.serializers.DeclaredDocument):
    {"providers": [{name, kind, description, config}, ...],
     "queues": [{name, kind, description, provider, elasticity {kind, min, max,
                 threshold}, instance_type, image_id, runner, max_depth, on_full,
                 temperature}, ...]}
Each item holds only the fields the file gives. A field missing from the file is not
managed by it: left alone on update, its default on create. `export()` writes every
field, so what it writes applies as "up to date". A queue's state (drain, pause,
archive) is not declared here: the verbs change it.

A dry run is the apply itself, rolled back: the plan it shows is exactly what the
services would do, refusals included.

A removal that `rm` would refuse (a queue with bound daemons or work, a provider in use)
does not stop the plan: the item is kept with its refusal ({code, message}, the
service's), the rest is planned, and then nothing is changed and the whole plan is
refused (409 `apply_refused`, the items in the error's `items`), dry run or not.

An apply holds a database connection for its whole transaction, so it never waits on
a lock there: one apply runs at a time (a try of an advisory lock: another apply
answers 409 `apply_in_progress` at once, holding nothing), a row another request holds
(a queue a daemon claims from) is waited for at most LAKESHORE_APPLY_LOCK_TIMEOUT
(then 503 `busy`, nothing changed), and a document declares at most
LAKESHORE_APPLY_MAX_ITEMS providers and queues, counted before any is validated."""

import json
from contextlib import contextmanager

from django.conf import settings
from django.db import OperationalError, connection, transaction
from psycopg.errors import LockNotAvailable

from fleet import services as fleet_services
from fleet.models import Provider
from lakeshore_admin.errors import Busy, Conflict, DomainError, Invalid
from queues import elasticity, services
from queues.models import Queue

CREATE, UPDATE, UNCHANGED, DELETE = "create", "update", "unchanged", "delete"
QUEUE_PATCHABLE = (
    "description",
    "provider",
    "instance_type",
    "image_id",
    "runner",
    "max_depth",
    "on_full",
    "temperature",
)
PROVIDER_PATCHABLE = ("description", "config")
APPLY_LOCK = "lakeshore-apply"  # the advisory lock's name (hashed): one apply at a time
LOCKED_RETRY_AFTER = 1  # seconds: a row lock is most often held for a moment
PRUNE_NEVER_FORCES = (
    " (lakeshore apply --prune never forces: drain the queue first, or remove it by hand "
    "with 'lakeshore queues rm NAME --force')"
)


# ---------------------------------------------------------------------------- export


def export() -> dict:
    """Today's providers and queues (archived ones too) as a document, every field."""
    return {
        "providers": [provider_document(p) for p in Provider.objects.order_by("name")],
        "queues": [
            queue_document(q) for q in Queue.objects.select_related("provider").order_by("name")
        ],
    }


def provider_document(provider: Provider) -> dict:
    return {
        "name": provider.name,
        "kind": provider.kind,
        "description": provider.description,
        "config": provider.config,
    }


def queue_document(queue: Queue) -> dict:
    spec = queue.elasticity
    if spec:  # the parameters its kind uses (an unused one is always null)
        uses = elasticity.PARAMETERS[spec["kind"]][0]
        spec = {
            "kind": spec["kind"],
            **{k: spec[k] for k in elasticity.ALL_PARAMETERS if k in uses},
        }
    return {
        "name": queue.name,
        "kind": queue.kind,
        "description": queue.description,
        "provider": queue.provider.name if queue.provider_id else None,
        "elasticity": spec,
        "instance_type": queue.instance_type,
        "image_id": queue.image_id,
        "runner": queue.runner,
        "max_depth": queue.max_depth,
        "on_full": queue.on_full,
        "temperature": queue.temperature,
    }


# ---------------------------------------------------------------------------- apply


def plan(*, document: dict, prune: bool = False) -> dict:
    return apply(document=document, prune=prune, dry_run=True)


def apply(*, document: dict, prune: bool = False, dry_run: bool = False) -> dict:
    """Make providers and queues as the document declares them, all or nothing: providers
    first (a queue may name one), then queues; with `prune`, remove the queues and then
    the providers it does not declare, as `rm` would (never forced). Answers
    {applied, up_to_date, dry_run, items: [{type, name, action, changes, refused}]}, or
    raises Conflict `apply_refused` with those items when a removal is refused."""
    providers = document.get("providers", [])
    queues = document.get("queues", [])
    _refuse_duplicates({**_duplicates("providers", providers), **_duplicates("queues", queues)})
    try:
        return _apply_in_one_transaction(providers, queues, prune=prune, dry_run=dry_run)
    except OperationalError as exc:
        if isinstance(exc.__cause__, LockNotAvailable):
            raise Busy(
                "Another request holds a queue or provider this apply changes; it waited "
                f"{settings.LAKESHORE_APPLY_LOCK_TIMEOUT:g} s (LAKESHORE_APPLY_LOCK_TIMEOUT) "
                "and changed nothing. Try again.",
                retry_after=LOCKED_RETRY_AFTER,
            ) from exc
        raise


def _apply_in_one_transaction(
    providers: list[dict], queues: list[dict], *, prune: bool, dry_run: bool
):
    with transaction.atomic():
        _take_apply_lock()
        _refuse_immutable_changes(providers, queues)
        items = [_provider(spec, f"providers[{i}]") for i, spec in enumerate(providers)]
        items += [_queue(spec, f"queues[{i}]") for i, spec in enumerate(queues)]
        if prune:
            items += [
                _delete_queue(queue)
                for queue in Queue.objects.exclude(name__in=[s["name"] for s in queues])
                .select_related("provider")
                .order_by("name")
            ]
            items += [
                _delete_provider(provider)
                for provider in Provider.objects.exclude(
                    name__in=[s["name"] for s in providers]
                ).order_by("name")
            ]
        up_to_date = all(item["action"] == UNCHANGED for item in items)
        refused = [item for item in items if item["refused"]]
        if dry_run or refused:
            transaction.set_rollback(True)
    if refused:
        raise _plan_refused(refused, items, dry_run=dry_run)
    return {
        "applied": not dry_run and not up_to_date,
        "up_to_date": up_to_date,
        "dry_run": dry_run,
        "items": items,
    }


def refuse_too_many_items(data) -> None:
    """Refuse an apply whose document declares more than LAKESHORE_APPLY_MAX_ITEMS
    providers and queues together, counted in the request as it came (`data`, the
    parsed body, not yet validated), so an oversized document costs no item's
    validation. Anything not shaped as a document is left to the validation."""
    document = data.get("document") if isinstance(data, dict) else None
    if not isinstance(document, dict):
        return
    count = sum(
        len(items)
        for items in (document.get("providers"), document.get("queues"))
        if isinstance(items, list)
    )
    limit = settings.LAKESHORE_APPLY_MAX_ITEMS
    if count > limit:
        message = (
            f"The document declares {count} providers and queues; at most {limit} "
            "(LAKESHORE_APPLY_MAX_ITEMS). Split it, or raise the setting."
        )
        raise Invalid(message, fields={"document": message})


def _take_apply_lock() -> None:
    """In the apply's transaction: the apply lock, or 409 `apply_in_progress` at once
    (never a wait, which would hold this connection); then every row lock is waited for
    at most LAKESHORE_APPLY_LOCK_TIMEOUT (past it, the statement fails: LockNotAvailable)."""
    timeout_ms = max(1, round(settings.LAKESHORE_APPLY_LOCK_TIMEOUT * 1000))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", [APPLY_LOCK])
        if not cursor.fetchone()[0]:
            raise Conflict(
                "Another apply is in progress; nothing was changed. Try again when it ends.",
                code="apply_in_progress",
            )
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{timeout_ms}ms"])


def _provider(spec: dict, path: str) -> dict:
    name = spec["name"]
    current = Provider.objects.filter(name=name).first()
    with _errors_of(path, f"provider {name}"):
        if current is None:
            created = fleet_services.provider_create(**spec)
            return _item("provider", name, CREATE, _diff({}, provider_document(created)))
        before = provider_document(current)
        changes = {
            field: spec[field]
            for field in PROVIDER_PATCHABLE
            if field in spec and not _same(spec[field], before[field])
        }
        if not changes:
            return _item("provider", name, UNCHANGED)
        fleet_services.provider_patch(name=name, changes=changes)
    after = provider_document(Provider.objects.get(name=name))
    return _item("provider", name, UPDATE, _diff(before, after))


def _queue(spec: dict, path: str) -> dict:
    name = spec["name"]
    current = Queue.objects.select_related("provider").filter(name=name).first()
    with _errors_of(path, f"queue {name}"):
        if current is None:
            fields = dict(spec)
            created = services.queue_create(
                elasticity_spec=fields.pop("elasticity", None), **fields
            )
            return _item("queue", name, CREATE, _diff({}, queue_document(created)))
        before = queue_document(current)
        changes = {field: spec[field] for field in QUEUE_PATCHABLE if field in spec}
        numbers = {k: v for k, v in (spec.get("elasticity") or {}).items() if k != "kind"}
        if numbers:
            changes["elasticity"] = numbers
        if not changes:
            return _item("queue", name, UNCHANGED)
        # The service's own dry run says what these values become (defaults, a cleared
        # provider): only what really differs is patched, so an unchanged queue is left
        # alone and leaves no audit row.
        preview = services.queue_patch(name=name, changes=changes, dry_run=True)
        differs = _diff(before, queue_document(preview))
        if not differs:
            return _item("queue", name, UNCHANGED)
        services.queue_patch(name=name, changes=_patch_of(differs))
    after = queue_document(services.queue_get(name))
    return _item("queue", name, UPDATE, _diff(before, after))


def _delete_queue(queue: Queue) -> dict:
    item = _item("queue", queue.name, DELETE, _diff(queue_document(queue), {}))
    return _removal(item, lambda: services.queue_delete(name=queue.name, force=False))


def _delete_provider(provider: Provider) -> dict:
    item = _item("provider", provider.name, DELETE, _diff(provider_document(provider), {}))
    return _removal(item, lambda: fleet_services.provider_delete(name=provider.name))


def _removal(item: dict, remove) -> dict:
    """Remove, in a savepoint: a refusal is kept on the item and undoes only this one,
    so the rest of the plan is still worked out."""
    try:
        with transaction.atomic():
            remove()
    except Conflict as exc:
        item["refused"] = {"code": exc.code, "message": exc.message}
    return item


# ---------------------------------------------------------------------------- refusals


def _duplicates(section: str, specs: list[dict]) -> dict:
    first: dict[str, int] = {}
    found = {}
    for index, spec in enumerate(specs):
        name = spec["name"]
        if name in first:
            found[f"{section}[{index}].name"] = (
                f"'{name}' is declared twice (first as {section}[{first[name]}])"
            )
        first.setdefault(name, index)
    return found


def _plan_refused(refused: list[dict], items: list[dict], *, dry_run: bool) -> Conflict:
    names = ", ".join(f"{item['type']} {item['name']}" for item in refused)
    count = f"{len(refused)} removal{'s' if len(refused) > 1 else ''}"
    note = PRUNE_NEVER_FORCES if any(item["type"] == "queue" for item in refused) else ""
    return Conflict(
        f"{count} of the plan {'is' if len(refused) == 1 else 'are'} refused ({names}), "
        f"so nothing was changed{note}.",
        extra={"dry_run": dry_run, "items": items},
        code="apply_refused",
    )


def _refuse_duplicates(found: dict) -> None:
    if found:
        raise Invalid(
            "; ".join(f"{path}: {message}" for path, message in found.items()), fields=found
        )


def _refuse_immutable_changes(providers: list[dict], queues: list[dict]) -> None:
    """What patch cannot change (a provider's kind, a queue's kind, its elasticity kind)
    cannot be reconciled by the file: it is refused, naming each item, before any write."""
    found: dict[str, str] = {}
    messages: list[str] = []

    def refuse(path: str, label: str, what: str, old, new) -> None:
        message = f"cannot change ({old or 'none'} → {new or 'none'}): remove and re-create it"
        found[path] = message
        messages.append(f"{label}: {what} {message}")

    existing = Provider.objects.in_bulk([s["name"] for s in providers], field_name="name")
    for index, spec in enumerate(providers):
        current = existing.get(spec["name"])
        if current and "kind" in spec and spec["kind"] != current.kind:
            label = f"provider {current.name}"
            refuse(f"providers[{index}].kind", label, "kind", current.kind, spec["kind"])
    existing = Queue.objects.in_bulk([s["name"] for s in queues], field_name="name")
    for index, spec in enumerate(queues):
        current = existing.get(spec["name"])
        if current is None:
            continue
        label = f"queue {current.name}"
        if "kind" in spec and spec["kind"] != current.kind:
            refuse(f"queues[{index}].kind", label, "kind", current.kind, spec["kind"])
        if "elasticity" in spec:
            new = (spec["elasticity"] or {}).get("kind") or ""
            if new != current.elasticity_kind:
                path = f"queues[{index}].elasticity" + (".kind" if new else "")
                refuse(path, label, "elasticity kind", current.elasticity_kind, new)
    if found:
        raise Invalid("; ".join(messages) + ".", fields=found)


@contextmanager
def _errors_of(path: str, label: str):
    """A service's refusal of a declared item, re-raised with the item named: its message
    prefixed with the item, its fields with the item's path in the document (`max` →
    `queues[2].elasticity.max`), its code and status kept."""
    try:
        yield
    except DomainError as exc:
        fields = {
            (f"{path}.{key}" if key and key != "__all__" else path): message
            for key, message in exc.fields.items()
        } or {path: exc.message}
        again = DomainError(
            f"{label}: {exc.message}", fields=fields, extra=exc.extra, code=exc.code
        )
        again.status = exc.status
        raise again from exc


# ---------------------------------------------------------------------------- diffs


def _flat(document: dict) -> dict:
    """`elasticity` as elasticity.kind/min/max/threshold, so a change names its number."""
    out = {}
    for key, value in document.items():
        if key == "elasticity" and value is not None:
            for sub in ("kind", *elasticity.ALL_PARAMETERS):
                out[f"elasticity.{sub}"] = value.get(sub)
        elif key != "name":
            out[key] = value
    return out


def _same(a, b) -> bool:
    """Equal as JSON (so True is not 1, and key order does not matter)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _diff(before: dict, after: dict) -> dict:
    old, new = _flat(before), _flat(after)
    return {
        field: {"old": old.get(field), "new": new.get(field)}
        for field in [*old, *(f for f in new if f not in old)]
        if not _same(old.get(field), new.get(field))
    }


def _patch_of(differs: dict) -> dict:
    """The patch that makes exactly these changes (their new values, as the service's
    dry run worked them out)."""
    patch: dict = {}
    for field, change in differs.items():
        if field.startswith("elasticity."):
            patch.setdefault("elasticity", {})[field.split(".", 1)[1]] = change["new"]
        else:
            patch[field] = change["new"]
    return patch


def _item(kind: str, name: str, action: str, changes: dict | None = None) -> dict:
    return {"type": kind, "name": name, "action": action, "changes": changes or {}, "refused": None}
