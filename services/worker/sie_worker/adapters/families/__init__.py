"""The model families, one module each. FAMILIES: each family's adapter class by its spec's name (the `adapter:` of
model profiles), found by importing every module here: a new family is its module alone."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from sie_worker.adapters.contract import Adapter


def _discover() -> dict[str, type[Adapter]]:
    found: dict[str, type[Adapter]] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Adapter) and "spec" in value.__dict__:
                name = value.spec.name
                if found.get(name, value) is not value:
                    raise TypeError(f"adapter {name!r} is declared twice: {found[name].__name__} and {value.__name__}")
                found[name] = value
    return found


FAMILIES: Mapping[str, type[Adapter]] = MappingProxyType(_discover())
