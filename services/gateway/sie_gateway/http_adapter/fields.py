"""Reading the fields of a decoded body (a msgpack or JSON map) by name and type, the way each wire's requests
define them: a field of the wrong type, a missing required one and a name the request does not define are 400 with
the field named (`items[2].text`), never silently dropped or coerced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf import struct_pb2

from sie_gateway.http_adapter.bodies import kind_of
from sie_gateway.http_adapter.errors import AdapterError, invalid


class Fields:
    """The fields of map `body` (at `where`, "" for the body itself); `done()` refuses the ones never read."""

    def __init__(self, body: Any, where: str = "", unsupported: Mapping[str, str] | None = None) -> None:
        """`unsupported`: fields the protocol defines that this engine cannot do -> why (400 NOT_SUPPORTED)."""
        if not isinstance(body, dict):
            raise wrong_type(where or "the body", "a map (object)", body)
        self.body = body
        self.where = where
        self.read: set[str] = set()
        for name, why in (unsupported or {}).items():
            if body.get(name) is not None:
                raise AdapterError(400, "NOT_SUPPORTED", f"{self.path(name)}: {why}", field=self.path(name))

    def path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str) -> Any:
        self.read.add(name)
        return self.body.get(name)

    def required(self, name: str) -> Any:
        value = self.get(name)
        if value is None:
            raise invalid(f"{self.path(name)} is required", reason="MISSING_FIELD", field=self.path(name))
        return value

    def text(self, name: str, *, required: bool = False) -> str | None:
        value = self.required(name) if required else self.get(name)
        if value is not None and not isinstance(value, str):
            raise wrong_type(self.path(name), "a string", value)
        return value

    def flag(self, name: str) -> bool | None:
        value = self.get(name)
        if value is not None and not isinstance(value, bool):
            raise wrong_type(self.path(name), "true or false", value)
        return value

    def whole(self, name: str) -> int | None:
        value = self.get(name)
        if isinstance(value, np.integer):
            value = int(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise wrong_type(self.path(name), "a whole number", value)
        if value is not None and not -(2**31) <= value < 2**31:
            raise invalid(f"{self.path(name)} is out of range", reason="OUT_OF_RANGE", field=self.path(name))
        return value

    def number(self, name: str) -> float | None:
        """A number (whole or not) that a double holds: a JSON integer of hundreds of digits is 400, naming it."""
        value = self.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong_type(self.path(name), "a number", value)
        return as_double(value, self.path(name))

    def texts(self, name: str) -> list[str] | None:
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(entry, str) for entry in value):
            raise wrong_type(self.path(name), "an array of strings", value)
        return value

    def mapping(self, name: str) -> dict[str, Any] | None:
        value = self.get(name)
        if value is not None and not isinstance(value, dict):
            raise wrong_type(self.path(name), "a map (object)", value)
        return value

    def done(self, takes: str = "") -> None:
        """Refuse a field the request does not define (UNKNOWN_FIELD), naming those it does."""
        unknown = [key for key in self.body if key not in self.read]
        if unknown:
            key = unknown[0]
            name = self.path(key if isinstance(key, str) else repr(key)[:64])
            known = takes or ", ".join(sorted(self.read))
            raise invalid(
                f"unknown field {name[:200]!r}: the request has no such field; there it takes {known}",
                reason="UNKNOWN_FIELD",
                field=name[:200],
            )


def wrong_type(where: str, expected: str, value: Any) -> AdapterError:
    return invalid(f"{where} must be {expected}, not {kind_of(value)}", reason="WRONG_TYPE", field=where)


def as_double(value: float, where: str) -> float:
    """`value` as a double; 400 OUT_OF_RANGE naming `where` for an integer past a double's range (JSON writes any)."""
    try:
        return float(value)
    except OverflowError:
        raise invalid(
            f"{where} is a number past a double's range (about 1.8e308): send a smaller one",
            reason="OUT_OF_RANGE",
            field=where,
        ) from None


def struct(value: dict[str, Any] | None, where: str) -> struct_pb2.Struct | None:
    """A map of plain JSON values (strings, numbers, booleans, null, arrays and maps of them) as a Struct."""
    if value is None:
        return None
    _check_json(value, where)
    message = struct_pb2.Struct()
    message.update(value)
    return message


def _check_json(value: Any, where: str) -> None:
    pending = [(value, where)]
    while pending:
        node, path = pending.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise wrong_type(f"a key of {path}", "a string", key)
                pending.append((child, f"{path}.{key[:64]}"))
        elif isinstance(node, list):
            pending.extend((child, f"{path}[{index}]") for index, child in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool):
            as_double(node, path)  # a Struct holds numbers as doubles
        elif not isinstance(node, str | float | bool | type(None)):
            raise wrong_type(path, "a string, number, boolean, null, array or map", node)
