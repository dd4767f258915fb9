"""The console's one list view: queues, jobs, daemons, events and tokens are subclasses.

One paging scheme: a keyset on one unique, indexed key (`ordering`). `?after=KEY` is the
page that follows the row KEY, `?before=KEY` the page that comes before it, both in the
list's own order. When the filtered list holds at most `max_pages` pages (found with one
bounded query of keys, never a COUNT of the whole table), the pager also numbers them.
A broken key shows the first page and says so.

One filter form: the FilterSet's own form, drawn by templates/console/list.html, which
also draws the table and the pager. A page gives its columns and rows only."""

import copy

from django import forms
from django.db import models
from django.http import QueryDict
from django.utils.http import urlencode
from django.views.generic import TemplateView

from lakeshore_admin.errors import DomainError

AFTER, BEFORE = "after", "before"
BAD_KEY = "That page link is broken or too old; this is the first page."
BIGINT = 2**63 - 1


class ConsoleListView(TemplateView):
    """A console list. A subclass declares what it lists; the hooks have plain defaults."""

    template_name: str  # the page: its title, its heading, its `columns` partial
    table_id: str  # the id of the box htmx swaps (the table, the pager, the errors)
    filterset_class = None
    ordering = "-id"  # one unique, indexed field; '-' for newest (highest) first
    page_size = 50
    max_pages = 10  # number the pages of a list up to this long
    refresh = True  # the table refreshes itself every LAKESHORE_CONSOLE_REFRESH_SECONDS
    shown_filters: tuple[str, ...] | None = None  # the form's fields, in order (None: all)
    filter_look: dict[str, dict] = {}  # per field: label, widget, attrs, empty_label
    table_class = "stack"  # "stack": one block per row on phones (each cell's data-label)
    above_table = False  # the page has an "above" partial, drawn over the table
    labels = {"first": "First", "previous": "← Previous", "next": "Next →"}

    # ------------------------------------------------------------------ what to list

    def get_queryset(self):
        return self.filterset_class._meta.model._default_manager.all()

    def filter_data(self) -> QueryDict:
        """The query string the FilterSet reads (a list may add defaults)."""
        return self.request.GET

    def source(self, filterset):
        """What the page reads its rows from once the filters are valid."""
        return filterset.qs

    def decorate(self, rows: list) -> None:
        """Add what a page's rows show beyond their own columns (a few queries a page)."""

    def extra_context_data(self) -> dict:
        """What a page shows beside its list (buttons, counts). self.filterset and
        self.valid are set by then."""
        return {}

    def datalists(self) -> dict[str, list[str]]:
        """Suggestions for text filters: {datalist id: values}."""
        return {}

    # ------------------------------------------------------------------ the key

    @property
    def key_field(self) -> str:
        return self.ordering.lstrip("-")

    @property
    def descending(self) -> bool:
        return self.ordering.startswith("-")

    def parse_key(self, raw: str):
        """A key from the address, or None if it is not one (checked as the key's own
        field checks its values: a number within bigint, a name of its length)."""
        model = self.filterset_class._meta.model
        field = model._meta.get_field(self.key_field)
        if isinstance(field, models.IntegerField):
            check = forms.IntegerField(min_value=-BIGINT, max_value=BIGINT)
        else:
            check = field.formfield()
        try:
            return check.clean(raw)
        except forms.ValidationError:
            return None

    def key_of(self, row) -> str:
        return str(getattr(row, self.key_field))

    def fetch(self, source, *, after=None, before=None, limit: int) -> list:
        """Up to `limit` rows after the key `after` (or from the start), or the `limit`
        rows just before the key `before`, in the list's order."""
        name, forward, backward = self.key_field, self.ordering, self._reverse()
        if before is not None:
            past = "gt" if self.descending else "lt"
            rows = list(source.filter(**{f"{name}__{past}": before}).order_by(backward)[:limit])
            return rows[::-1]
        if after is not None:
            ahead = "lt" if self.descending else "gt"
            source = source.filter(**{f"{name}__{ahead}": after})
        return list(source.order_by(forward)[:limit])

    def keys(self, source, *, limit: int) -> list[str]:
        """The first `limit` keys of the list, in order (one index scan)."""
        values = source.order_by(self.ordering).values_list(self.key_field, flat=True)
        return [str(value) for value in values[:limit]]

    def _reverse(self) -> str:
        return self.key_field if self.descending else f"-{self.key_field}"

    # ------------------------------------------------------------------ the page

    def table_only(self) -> bool:
        """An htmx request for the table alone (a filter, a page, a refresh)."""
        return bool(self.request.htmx and self.request.htmx.target == self.table_id)

    def get_template_names(self):
        if self.table_only():
            return ["console/list.html#table"]
        return [self.template_name]

    def get(self, request, *args, **kwargs):
        self.filterset = filterset = self.filterset_class(
            self.filter_data(), queryset=self.get_queryset(), request=request
        )
        self.tune_form(filterset.form)
        self.valid = valid = filterset.is_valid()
        errors = None if valid else filterset.errors
        page = {"rows": []}
        if valid:
            try:
                page = self.page(self.source(filterset))
            except DomainError as error:  # filters the list cannot read (too broad)
                self.valid = False
                errors = self.refused(filterset.form, error)
        self.decorate(page["rows"])
        form = filterset.form
        context = self.get_context_data(
            **page,
            form=form,
            filter_fields=[form[name] for name in self.shown_filters or form.fields],
            errors=errors,
            datalists=self.datalists(),
            list_url=request.path,
            query=request.GET.urlencode(),
            # the table's own refresh (it triggered the request): not a new filter or page
            table_only=self.table_only(),
            is_refresh=bool(request.htmx and request.htmx.trigger == self.table_id),
            **self.extra_context_data(),
        )
        return self.render_to_response(context)

    def tune_form(self, form) -> None:
        """The console's look of the FilterSet's form (labels, widgets); a field with an
        error is marked aria-invalid."""
        for name, look in self.filter_look.items():
            field = form.fields[name]
            if "widget" in look:
                field.widget = copy.deepcopy(look["widget"])  # never the class's own
            if "label" in look:
                field.label = look["label"]
            if "empty_label" in look:
                field.empty_label = look["empty_label"]
            if hasattr(field, "choices"):
                field.widget.choices = field.choices  # the widget reads this field's
            field.widget.attrs.update(look.get("attrs", {}))
        if form.is_bound and not form.is_valid():
            for name in form.errors:
                if name in form.fields:
                    form.fields[name].widget.attrs["aria-invalid"] = "true"

    def refused(self, form, error: DomainError) -> dict:
        """What the list says when reading it was refused: the error on the fields it
        names (marked as the form's own errors are), else on the whole form."""
        for name in error.fields:
            if name in form.fields:
                form.add_error(name, error.message)
                form.fields[name].widget.attrs["aria-invalid"] = "true"
        return dict(form.errors) or {"__all__": [error.message]}

    def page(self, source) -> dict:
        """The rows of the page the address asks for, and the pager's links."""
        get = self.request.GET
        size = self.page_size
        key = {}
        note = None
        for name in (AFTER, BEFORE):
            if get.get(name):
                parsed = self.parse_key(get[name])
                if parsed is None:
                    note = BAD_KEY
                else:
                    key = {name: parsed}
                break
        rows = self.fetch(source, **key, limit=size + 1)
        more = len(rows) > size
        if BEFORE in key:
            rows = rows[1:] if more else rows
            if not more and len(rows) < size:  # back at the start: a whole first page
                key = {}
                rows = self.fetch(source, limit=size + 1)
                more = len(rows) > size
        else:
            rows = rows[:size]
        after_more = more if BEFORE not in key else bool(rows)
        before_more = bool(key) and (more if BEFORE in key else bool(rows))
        links = {
            "next_url": self.link(after=self.key_of(rows[-1])) if after_more and rows else None,
            "previous_url": self.link(before=self.key_of(rows[0])) if before_more else None,
            "first_url": self.link() if key else None,
            "page_note": note,
        }
        pages = self.numbers(source, rows)
        if pages:
            links["first_url"] = None  # page 1 is in the numbers
        return {"rows": rows, "pages": pages, **links}

    def numbers(self, source, rows) -> list[dict]:
        """Page links 1..N when the list has 2..max_pages pages; [] otherwise."""
        size = self.page_size
        keys = self.keys(source, limit=size * self.max_pages + 1)
        if len(keys) <= size or len(keys) > size * self.max_pages:
            return []
        first = self.key_of(rows[0]) if rows else None
        here = keys.index(first) // size if first in keys else -1
        return [
            {
                "number": n + 1,
                "url": self.link(after=keys[n * size - 1]) if n else self.link(),
                "current": n == here,
            }
            for n in range((len(keys) + size - 1) // size)
        ]

    def link(self, **key) -> str:
        """This list's address with its filters and one paging key (or none)."""
        params = self.request.GET.copy()
        for name in (AFTER, BEFORE):
            params.pop(name, None)
        params.update(key)
        query = urlencode(params, doseq=True)
        return f"{self.request.path}?{query}" if query else self.request.path
