"""Print the public names of an installed reference SDK (`sie_sdk`) as JSON: run with the interpreter it is installed
in (Python 3.12), e.g. `python reference_sdk_names.py > names.json`. tests/test_client_reference_surface.py compares
them with sie_client's, read the same way (`describe_module`), so both sides go through one description.

For each module: each public name (its `__all__`, else the names it defines or re-exports from the package) with its
kind and, by kind: a function's or class's parameters, a class's public methods and properties and its bases among
the module's classes, a TypedDict's keys."""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import sys
import typing
from typing import Any

MODULES = ("sie_sdk", "sie_sdk.types", "sie_sdk.encoding", "sie_sdk.scoring", "sie_sdk.client")


def parameters(function: Any) -> list[dict[str, str]] | None:
    """Each parameter: name, kind (POSITIONAL_OR_KEYWORD, KEYWORD_ONLY, ...) and default (repr, or "" for none)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    return [
        {
            "name": parameter.name,
            "kind": parameter.kind.name,
            "default": "" if parameter.default is inspect.Parameter.empty else repr(parameter.default),
        }
        for parameter in signature.parameters.values()
        if parameter.name != "self"
    ]


def is_typed_dict(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, dict) and hasattr(value, "__required_keys__")


def describe(value: Any) -> dict[str, Any]:
    if is_typed_dict(value):
        return {"kind": "typeddict", "keys": sorted(value.__annotations__), "required": sorted(value.__required_keys__)}
    if isinstance(value, type) and issubclass(value, enum.Enum):
        return {"kind": "enum", "members": sorted(value.__members__)}
    if isinstance(value, type):
        methods: dict[str, Any] = {}
        for name, member in inspect.getmembers(value):
            if name.startswith("_") and name not in ("__init__", "__enter__", "__exit__", "__aenter__", "__aexit__"):
                continue
            if isinstance(inspect.getattr_static(value, name), property):
                methods[name] = {"kind": "property"}
            elif callable(member):
                methods[name] = {"kind": "method", "parameters": parameters(member)}
        bases = [f"{cls.__module__}.{cls.__qualname__}" for cls in value.__mro__[1:] if cls is not object]
        return {"kind": "class", "methods": methods, "bases": bases}
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return {"kind": "function", "parameters": parameters(value)}
    if isinstance(value, typing.TypeAliasType if hasattr(typing, "TypeAliasType") else ()) or typing.get_origin(value):
        return {"kind": "alias", "value": repr(value)}
    if inspect.ismodule(value):
        return {"kind": "module"}
    return {"kind": "value", "type": type(value).__name__}


def public_names(module: Any) -> list[str]:
    """`__all__`, else the public names the module's own source defines at its top level."""
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted(declared)
    defined: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.TypeAlias)) and isinstance(
            node.target if isinstance(node, ast.AnnAssign) else node.name, ast.Name
        ):
            defined.add((node.target if isinstance(node, ast.AnnAssign) else node.name).id)  # type: ignore[union-attr]
    return sorted(name for name in defined if not name.startswith("_"))


def describe_module(name: str) -> dict[str, Any]:
    module = importlib.import_module(name)
    return {attribute: describe(getattr(module, attribute)) for attribute in public_names(module)}


if __name__ == "__main__":
    modules = sys.argv[1:] or MODULES
    json.dump({name: describe_module(name) for name in modules}, sys.stdout, indent=1, sort_keys=True)
