"""Named points in the code where a test can force an interleaving: a drop that lands
between a claim's check and its statement, a claim between scale-down's choice and its
update. In production nothing is registered and a point costs one dict lookup."""

from collections.abc import Callable

_registered: dict[str, Callable[[], None]] = {}


def point(name: str) -> None:
    action = _registered.get(name)
    if action is not None:
        action()


def register(name: str, action: Callable[[], None]) -> None:
    _registered[name] = action


def clear(name: str | None = None) -> None:
    if name is None:
        _registered.clear()
    else:
        _registered.pop(name, None)
