"""Which queues the controller looks after, in one place.

`managed`: the queues a tick decides for: those with an elasticity declaration that are
not archived (with a provider or not: one without says why it does not grow), and an
archived one while its provider still runs daemons for it (it scales them to zero).

`starting`: of those, the queues whose daemons the controller starts: a provider, and
not archived. A submit into one that no live daemon serves wakes the controller. The
submit learns it in its own INSERT, so jobs/serving.py (below fleet: it cannot import
this) states the same rule in SQL (_STARTS); tests/queues/test_controller_queues.py
checks the two agree."""

from django.contrib.postgres.fields import ArrayField
from django.db.models import CharField, Exists, Func, OuterRef, Q, QuerySet

from fleet.models import Daemon
from lakeshore_admin.names import NAME_MAX_LENGTH
from queues.models import Queue, QueueState

_NAME_ARRAY = Func(
    OuterRef("name"),
    function="ARRAY",
    template="ARRAY[%(expressions)s]::varchar(63)[]",
    output_field=ArrayField(CharField(max_length=NAME_MAX_LENGTH)),
)


def managed() -> QuerySet[Queue]:
    running_daemons = (
        Daemon.objects.live()
        .filter(provider__isnull=False, queues__contains=_NAME_ARRAY)
        .order_by()
    )
    declared = ~Q(elasticity_kind="") & ~Q(state=QueueState.ARCHIVED)
    winding_down = Q(state=QueueState.ARCHIVED) & Exists(running_daemons)
    return Queue.objects.filter(declared | winding_down)


def starting() -> QuerySet[Queue]:
    return managed().filter(provider__isnull=False).exclude(state=QueueState.ARCHIVED)
