"""Envoy's Lua filter that refuses an HTTP/JSON body with a field its message lacks (unknown_fields.lua).

Envoy's gRPC-JSON transcoder drops unknown JSON fields without a word (it has
no option to refuse them), so the filter runs in front of it. Which fields
each body may hold is read here from the contract's descriptor set and
written into the Lua source as two tables, so the check follows `proto/`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2

# Messages whose JSON form is free (Struct, Value, ListValue, Any) or a JSON scalar (Timestamp,
# Duration, wrappers): their insides are not checked.
_WELL_KNOWN = "google.protobuf."


def template_parts(template: str) -> list[str]:
    """A google.api.http path template as literal parts and `*` (one segment) / `**` (the rest)."""
    template = re.sub(r"\{[^}=]+\}", "*", template)  # {name} is {name=*}
    template = re.sub(r"\{[^}=]+=([^}]*)\}", r"\1", template)
    return [part for part in re.split(r"(\*\*|\*)", template) if part]


def lua_filter(
    files: Iterable[descriptor_pb2.FileDescriptorProto],
    routes: Iterable[tuple[str, str, str]],
) -> dict[str, Any]:
    """The Lua HTTP filter for `routes`: (HTTP method, path template, full name of the body's message)."""
    routes = list(routes)
    messages = _messages(files)
    reachable = _reachable(messages, [message for _, _, message in routes])
    lines = ["MESSAGES = {}"]
    for name in sorted(reachable):
        fields = ", ".join(
            f"[{_lua_string(key)}] = {value}" for key, value in _fields(messages, name)
        )
        known = _lua_string(" ".join(field.name for field in messages[name].field))
        lines.append(
            f"MESSAGES[{_lua_string(name)}] = {{fields = {{{fields}}}, known = {known}}}"
        )
    route_rows = ", ".join(
        f"{{{_lua_string(method)}, {_lua_string(_lua_pattern(template))}, {_lua_string(message)}}}"
        for method, template, message in routes
    )
    lines.append(f"ROUTES = {{{route_rows}}}")
    source = (
        "\n".join(lines)
        + "\n\n"
        + resources.files("sie_stack").joinpath("unknown_fields.lua").read_text()
    )
    return {
        "name": "envoy.filters.http.lua",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": source},
        },
    }


def _messages(
    files: Iterable[descriptor_pb2.FileDescriptorProto],
) -> dict[str, descriptor_pb2.DescriptorProto]:
    """Every message of `files` by full name (nested ones included, map entries too)."""
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def add(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{message.name}"
        found[name] = message
        for nested in message.nested_type:
            add(name, nested)

    for file in files:
        for message in file.message_type:
            add(file.package, message)
    return found


def _reachable(
    messages: dict[str, descriptor_pb2.DescriptorProto], roots: list[str]
) -> set[str]:
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in seen or name.startswith(_WELL_KNOWN):
            continue
        seen.add(name)
        for field in messages[name].field:
            if field.type == field.TYPE_MESSAGE:
                pending.append(field.type_name.lstrip("."))
    return {name for name in seen if not messages[name].options.map_entry}


def _fields(
    messages: dict[str, descriptor_pb2.DescriptorProto], name: str
) -> Iterator[tuple[str, str]]:
    """(JSON key, Lua value) of each field, under its proto name and its lowerCamel JSON name."""
    for field in messages[name].field:
        value = _lua_child(messages, field)
        for key in dict.fromkeys((field.name, field.json_name or field.name)):
            yield key, value


def _lua_child(
    messages: dict[str, descriptor_pb2.DescriptorProto],
    field: descriptor_pb2.FieldDescriptorProto,
) -> str:
    if field.type != field.TYPE_MESSAGE:
        return "false"
    type_name = field.type_name.lstrip(".")
    if type_name.startswith(_WELL_KNOWN):
        return "false"
    entry = messages[type_name]
    if entry.options.map_entry:
        value = next(f for f in entry.field if f.number == 2)
        return f"{{map = {_lua_child(messages, value)}}}"
    return _lua_string(type_name)


def _lua_pattern(template: str) -> str:
    """The template as an anchored Lua pattern over the whole path."""
    parts = template_parts(template)
    return (
        "^"
        + "".join(
            ".+"
            if p == "**"
            else "[^/]+"
            if p == "*"
            else re.sub(r"([^A-Za-z0-9])", r"%\1", p)
            for p in parts
        )
        + "$"
    )


def _lua_string(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.%^$/+\[\] -]*", text):
        raise ValueError(f"not a plain name or pattern: {text!r}")
    return f'"{text}"'
