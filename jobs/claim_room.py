"""A claim's answer is bounded by bytes (issue 17): LAKESHORE_CLAIM_MAX_BYTES of
arguments, and always at least one invocation.

The claim statement (jobs/transitions/claim.py) enforces the bound itself: of the candidates
it locks, in its order, it takes those whose arguments add up to at most its `room`,
and the first whatever it weighs when it starts the answer. A claim of several
statements (a daemon with several queues, a Boltzmann queue's levels) carries what is
left from one to the next here; the rows are weighed in Python only then."""

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

_JSON_TEXT = DjangoJSONEncoder(ensure_ascii=False)


def claim_bytes(invocation) -> int:
    """What an invocation's arguments weigh in a claim, as the claim statement counts
    them: args and kwargs as JSON text (PostgreSQL's spacing, UTF-8) and args_blob."""
    text = _JSON_TEXT.encode(invocation.args) + _JSON_TEXT.encode(invocation.kwargs)
    return len(text.encode()) + len(invocation.args_blob or b"")


class ClaimRoom:
    """The bytes one claim's answer has left, across its statements."""

    def __init__(self):
        self._left = settings.LAKESHORE_CLAIM_MAX_BYTES
        self._first = True
        self._unweighed: list = []

    def _weigh(self) -> None:
        self._left -= sum(claim_bytes(row) for row in self._unweighed)
        self._unweighed = []

    def full(self) -> bool:
        """Nothing more fits (once the answer holds something)."""
        self._weigh()
        return not self._first and self._left <= 0

    def left(self) -> dict:
        """The claim statement's `room` and `first`."""
        self._weigh()
        return {"room": max(self._left, 0), "first": self._first}

    def took(self, rows: list) -> list:
        """What a statement claimed, weighed when the next statement asks."""
        if rows:
            self._first = False
            self._unweighed += rows
        return rows
