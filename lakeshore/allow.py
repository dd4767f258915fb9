"""What a daemon may run (issue 17): the allow-list, checked on what a job resolves to.

A job names a function as `module.name` (the CLI's JSON jobs) or as module + qualname
(the Python SDK's envelopes, `kind == "ref"`). It runs only if:

1. the requested module is an allowed one, or inside one (`a.b` allows `a.b.c`), and
   the requested name is plain (an identifier without a leading '_', no dots): checked
   before anything is imported;
2. once the module is imported and the name looked up, the object found is itself
   defined in an allowed module (its own `__module__`) under a plain `__qualname__`.

So `mymodule.system`, where `mymodule` does `from os import system`, is refused: it is
`posix.system`, not a function of `mymodule`. So are methods re-exported from a class
(`Class.method`), private names and lambdas. Refused, nothing runs: the caller fails
the job with the text `refusal` and friends return."""

from collections.abc import Iterable

ALWAYS_ALLOWED = ("lakeshore.functions",)

HOW_TO_ADD = "set LAKESHORE_ALLOWED_MODULES where the daemon runs to add modules"


def parse_modules(text: str) -> tuple[str, ...]:
    """`"a.b, c"` → `("a.b", "c")`: the LAKESHORE_ALLOWED_MODULES syntax."""
    return tuple(m.strip() for m in (text or "").split(",") if m.strip())


MODULES_EXPECTED = "comma-separated module names (dotted identifiers, such as my_pkg.jobs)"


def not_modules(names: Iterable[str]) -> list[str]:
    """The entries of LAKESHORE_ALLOWED_MODULES that are no module's name: they would
    match no function, and every job naming the module meant would be refused."""
    return [name for name in names if not all(p.isidentifier() for p in name.split("."))]


def in_allowed(module: str, allowed: tuple[str, ...]) -> bool:
    """`module` is an allowed module or inside one (the prefix rule)."""
    return bool(module) and any(module == m or module.startswith(m + ".") for m in allowed)


def plain(name: object) -> bool:
    """A public name of a module's own: an identifier, no dots, no leading '_'."""
    return isinstance(name, str) and name.isidentifier() and not name.startswith("_")


def name_refusal(module: str, name: str, allowed: tuple[str, ...]) -> str | None:
    """Why `module.name` is refused before anything is imported, or None."""
    function = f"{module}.{name}" if module else name
    if not in_allowed(module, allowed):
        return (
            f"function {function!r} is not in an allowed module: this daemon runs "
            f"{', '.join(allowed)} ({HOW_TO_ADD})."
        )
    if not plain(name):
        return (
            f"function {function!r} is refused: {name!r} is not a plain public name of "
            f"module {module!r} (a job runs a module's own function by its name: no "
            "dotted Class.method path, no name starting with '_')."
        )
    return None


def target_refusal(function: str, target: object, allowed: tuple[str, ...]) -> str | None:
    """Why the object `function` resolved to is refused, or None: it must be defined
    in an allowed module, under a plain qualname."""
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    real = f"{module}.{qualname}" if module and qualname else repr(target)[:200]
    if not isinstance(module, str) or not in_allowed(module, allowed):
        return (
            f"function {function!r} is refused: it is {real}, defined in module "
            f"{module!r}, which is not an allowed module: this daemon runs "
            f"{', '.join(allowed)}. A job runs only functions defined in those modules, "
            f"not what they import ({HOW_TO_ADD})."
        )
    if not plain(qualname):
        return (
            f"function {function!r} is refused: it is {real}, which is not a plain "
            f"public function of module {module!r} (a method, a lambda, a private name "
            "or an object without a qualname). This daemon runs "
            f"{', '.join(allowed)}: their own functions, by their plain names."
        )
    return None
