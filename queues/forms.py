"""The console's queue forms: create (`/queues/add/`) and patch (`/queues/<name>/edit/`).

They carry text and nothing else. Every rule is the API's: the form's values go through
the API's own serializer (QueueInput, QueuePatch) and then the same service
(`queue_create`, `queue_patch`), and each refusal comes back to the field it names.
Field names are the API's; the elasticity ones are `elasticity.kind`, `elasticity.min`,
`elasticity.max` and `elasticity.threshold`, as the services name them in their errors.
"""

from django import forms
from django.forms.utils import ErrorList

from fleet.models import Provider
from lakeshore_admin.errors import DomainError
from queues import elasticity, services
from queues.api import serializers as api
from queues.models import ElasticityKind, OnFull, Queue, QueueKind

# Empty means "none" (null in the API): no bound, no elasticity number.
NULLABLE = {"max_depth", "elasticity.min", "elasticity.max", "elasticity.threshold"}
ELASTICITY_NUMBERS = ("min", "max", "threshold")
PROVIDERS_SHOWN = 500


class FieldErrors(ErrorList):
    """Django's error list, with the console's `error` class (red text)."""

    def __init__(self, initlist=None, error_class=None, **kwargs):
        super().__init__(initlist, error_class=f"{error_class or ''} error".strip(), **kwargs)


def _text(label: str, help_text: str = "", **attrs) -> forms.CharField:
    return forms.CharField(
        label=label,
        required=False,
        help_text=help_text,
        widget=forms.TextInput(attrs=attrs),
    )


def _number(label: str, help_text: str = "", *, step: str = "1") -> forms.CharField:
    # text, never checked here: the API's serializer parses it and says what is wrong
    return forms.CharField(
        label=label,
        required=False,
        help_text=help_text,
        widget=forms.NumberInput(attrs={"step": step}),
    )


def _choice(label: str, choices, help_text: str = "") -> forms.CharField:
    return forms.CharField(
        label=label,
        required=False,
        help_text=help_text,
        widget=forms.Select(choices=choices),
    )


# The daemons' isolation (`lakeshore daemon run --isolation`); the API takes any text,
# and a queue that holds another value keeps it as a choice on its edit form.
RUNNER_CHOICES = [("", "pool (the default)"), ("pool", "pool"), ("process", "process")]


def _values(choices) -> list[tuple[str, str]]:
    return [(value, value) for value, _ in choices]


def _elasticity_help() -> str:
    parts = []
    for kind, (uses, needs, _) in elasticity.PARAMETERS.items():
        used = [p for p in elasticity.ALL_PARAMETERS if p in uses]
        takes = ", ".join(f"{p} (required)" if p in needs else p for p in used)
        parts.append(f"{kind}: {takes}")
    return "Each kind takes: " + "; ".join(parts) + "."


def _shown(value) -> str:
    """A stored value as the form shows it (and compares it, to find what changed)."""
    return "" if value is None else str(value)


class QueueForm(forms.Form):
    """Fields shared by both forms; each subclass keeps those its API call accepts."""

    GROUPS: list[tuple[str, list[str]]] = []

    name = _text(
        "Name",
        "Lower-case letters, digits and '-', starting with a letter or digit.",
        autocomplete="off",
        spellcheck="false",
    )
    kind = _choice("Kind", _values(QueueKind.choices), "The claim order; it cannot change later.")
    description = _text("Description")
    provider = _choice("Provider", [], "Who starts daemons for the elasticity controller.")
    elasticity_kind = _choice(
        "Elasticity",
        [("", "none (no controller)"), *_values(ElasticityKind.choices)],
        _elasticity_help(),
    )
    elasticity_min = _number("Min daemons")
    elasticity_max = _number("Max daemons")
    elasticity_threshold = _number(
        "Threshold", "Target utilisation, above 0 and at most 1.", step="any"
    )
    max_depth = _number("Max depth", "Queued invocations at most; empty: unbounded.")
    on_full = _choice("When full", _values(OnFull.choices), "At max depth: refuse or wait.")
    temperature = _number("Temperature", "boltzmann queues only.", step="any")
    instance_type = _text("Instance type")
    image_id = _text("Image id")
    runner = _choice(
        "Runner",
        RUNNER_CHOICES,
        "How the daemons it starts run jobs: pool (warm processes, the default) or "
        "process (a fresh one per job).",
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("error_class", FieldErrors)
        super().__init__(*args, **kwargs)
        # The API's names on the page: elasticity.min, not elasticity_min.
        for name in list(self.fields):
            if name.startswith("elasticity_"):
                self.fields[name.replace("_", ".", 1)] = self.fields.pop(name)
        self.order_fields([name for _, names in self.GROUPS for name in names])
        for name in [n for n in self.fields if n not in self._kept()]:
            del self.fields[name]
        if "provider" in self.fields:
            names = list(
                Provider.objects.order_by("name").values_list("name", flat=True)[:PROVIDERS_SHOWN]
            )
            current = self.initial.get("provider")
            if current and current not in names:  # never cleared by not being listed
                names.append(current)
            self.fields["provider"].widget.choices = [("", "none"), *((n, n) for n in names)]
        self.message = ""  # a refusal's whole message, shown above the fields
        self.message_focused = False  # focus_first_error: no field to blame, the message
        self.status = 200

    def _kept(self) -> set[str]:
        return {name for _, names in self.GROUPS for name in names}

    @property
    def groups(self):
        """[(legend, [bound fields])] for the template, in the order of GROUPS."""
        shown = []
        for legend, names in self.GROUPS:
            fields = [self[name] for name in names if name in self.fields]
            if fields:
                shown.append((legend, fields))
        return shown

    def focus_first_error(self) -> None:
        """After a refused submit, the page opens with the focus on the first field
        marked invalid, in the order shown (autofocus; Django's widget already says
        aria-invalid and aria-describedby names its error); with no field to blame,
        on the refusal's message."""
        for _, fields in self.groups:
            for bound in fields:
                if bound.errors:
                    bound.field.widget.attrs["autofocus"] = True
                    return
        self.message_focused = bool(self.message or self.non_field_errors())

    def _through_api(self, serializer_class, payload: dict, call):
        """Check `payload` with the API's serializer, then `call` the service with what
        it validated. Returns the service's answer, or None with the errors on the form."""
        checked = serializer_class(data=payload)
        if not checked.is_valid():
            self.message = "The queue was not saved: see the fields marked below."
            self.status = 400
            for key, messages in _flatten(checked.errors):
                self._error_at(key, " ".join(str(m) for m in messages))
            return None
        try:
            return call(dict(checked.validated_data))
        except DomainError as exc:
            self.message = exc.message
            self.status = exc.status
            for key, text in exc.fields.items():
                if key in self.fields:
                    self.add_error(key, text)
            return None

    def _error_at(self, key: str, text: str) -> None:
        if key in self.fields:
            self.add_error(key, text)
        else:
            self.add_error(None, text if key == "non_field_errors" else f"{key}: {text}")


def _flatten(errors, prefix: str = ""):
    """DRF's nested errors as (the form's field name, [messages]): elasticity.min."""
    for key, value in errors.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, f"{name}.")
        elif key == "non_field_errors" and prefix:
            yield prefix.rstrip("."), value
        else:
            yield name, value


class QueueCreateForm(QueueForm):
    GROUPS = [
        ("Queue", ["name", "kind", "description"]),
        (
            "Elasticity",
            [
                "provider",
                "elasticity.kind",
                "elasticity.min",
                "elasticity.max",
                "elasticity.threshold",
            ],
        ),
        ("Backlog", ["max_depth", "on_full", "temperature"]),
        ("Launch", ["instance_type", "image_id", "runner"]),
    ]

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("initial", {"kind": QueueKind.FIFO, "on_full": OnFull.REJECT})
        kwargs["initial"].setdefault("temperature", "1.0")
        super().__init__(*args, **kwargs)

    def payload(self) -> dict:
        """The API's body (POST /api/v1/queues/) for what was typed."""
        data = self.cleaned_data
        body = {}
        for name in ("name", "description", "instance_type", "image_id", "runner"):
            body[name] = data[name]
        for name in ("kind", "on_full", "temperature"):
            if data[name] != "":  # left empty (or not sent): the API's default
                body[name] = data[name]
        body["provider"] = data["provider"] or None
        body["max_depth"] = data["max_depth"] or None
        numbers = {key: data[f"elasticity.{key}"] or None for key in ELASTICITY_NUMBERS}
        if data["elasticity.kind"] or any(v is not None for v in numbers.values()):
            # numbers without a kind: the serializer says the kind is required
            spec = {"kind": data["elasticity.kind"]} if data["elasticity.kind"] else {}
            body["elasticity"] = {**spec, **numbers}
        return body

    def save(self) -> Queue | None:
        """Create the queue as POST /api/v1/queues/ does; None when refused."""
        if not self.is_valid():
            return None

        def create(fields: dict) -> Queue:
            return services.queue_create(elasticity_spec=fields.pop("elasticity", None), **fields)

        return self._through_api(api.QueueInput, self.payload(), create)


class QueueEditForm(QueueForm):
    """The fields PATCH /api/v1/queues/<name>/ accepts (never name, kind or state); the
    elasticity numbers only on a queue that declares elasticity, temperature only on a
    boltzmann queue. Only what the user changed is sent."""

    GROUPS = [
        ("Queue", ["description"]),
        ("Elasticity", ["provider", "elasticity.min", "elasticity.max", "elasticity.threshold"]),
        ("Backlog", ["max_depth", "on_full", "temperature"]),
        ("Launch", ["instance_type", "image_id", "runner"]),
    ]

    def __init__(self, *args, queue: Queue, **kwargs):
        self.queue = queue
        kwargs["initial"] = {
            "description": queue.description,
            "provider": queue.provider.name if queue.provider else "",
            "elasticity.min": _shown(queue.elasticity_min),
            "elasticity.max": _shown(queue.elasticity_max),
            "elasticity.threshold": _shown(queue.elasticity_threshold),
            "max_depth": _shown(queue.max_depth),
            "on_full": queue.on_full,
            "temperature": _shown(queue.temperature),
            "instance_type": queue.instance_type,
            "image_id": queue.image_id,
            "runner": queue.runner,
        }
        super().__init__(*args, **kwargs)
        if queue.runner not in {value for value, _ in RUNNER_CHOICES}:
            self.fields["runner"].widget.choices = [*RUNNER_CHOICES, (queue.runner, queue.runner)]

    def _kept(self) -> set[str]:
        kept = super()._kept()
        if not self.queue.elasticity_kind:
            kept -= {f"elasticity.{key}" for key in ELASTICITY_NUMBERS}
        if self.queue.kind != QueueKind.BOLTZMANN:
            kept.discard("temperature")
        return kept

    def payload(self) -> dict:
        """The API's PATCH body: the fields whose value differs from the queue's."""
        body, numbers = {}, {}
        for name in self.changed_data:
            value = self.cleaned_data[name]
            if name in NULLABLE and value == "":
                value = None
            if name.startswith("elasticity."):
                numbers[name.removeprefix("elasticity.")] = value
            else:
                body[name] = value
        if numbers:
            body["elasticity"] = numbers
        return body

    def save(self) -> Queue | None:
        """Patch the queue as PATCH /api/v1/queues/<name>/ does; None when refused (or
        the queue itself when nothing changed)."""
        if not self.is_valid():
            return None
        body = self.payload()
        if not body:
            return self.queue

        def patch(changes: dict) -> Queue:
            return services.queue_patch(name=self.queue.name, changes=changes)

        return self._through_api(api.QueuePatch, body, patch)
