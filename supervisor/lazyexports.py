"""A package's re-exports imported on first use (PEP 562), so that importing one small submodule
(``supervisor.health.config`` from the config model) does not import the whole package: the
daemon's start-up is on the path to the job's first launch (issue 25 build 1)."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(package: str, where: Mapping[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``where`` maps an exported name to the
    submodule that defines it; the first access imports it and caches the value in ``namespace``
    (the package's globals), so later accesses are plain attribute reads."""

    def __getattr__(name: str) -> Any:
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
