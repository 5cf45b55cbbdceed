"""Envoy's Lua filter that refuses an HTTP/JSON body with a field its message lacks (unknown_fields.lua).

Envoy's gRPC-JSON transcoder drops unknown JSON fields without a word (it has
no option to refuse them), so the filter runs in front of it. Which fields
each body may hold is read here from the contract's descriptor set and
written into the Lua source as two tables, so the check follows `proto/`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
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


def template_fields(template: str) -> list[str]:
    """The fields a google.api.http path template binds (`{model=**}` binds `model`)."""
    return re.findall(r"\{([^}=]+)", template)


def lua_filter(
    files: Iterable[descriptor_pb2.FileDescriptorProto],
    routes: Iterable[tuple[str, str, str, list[str]]],
) -> dict[str, Any]:
    """The Lua HTTP filter for `routes`: (HTTP method, path template, full name of the body's message or
    "" for a route without a body, the fields of that message its path binds, which the body must then
    leave out). No route takes a query string."""
    routes = list(routes)
    messages = _messages(files)
    reachable = _reachable(messages, [message for _, _, message, _ in routes if message])
    lines = ["MESSAGES = {}"]
    lines.extend(_lua_message(messages, name, name) for name in sorted(reachable))
    route_rows: list[str] = []
    for method, template, message, in_path in routes:
        root = message
        if in_path:
            # The transcoder lets a body field override the path's (`model`, a pool's `name`).
            root = f"{message} without {' '.join(in_path)}"
            lines.append(_lua_message(messages, message, root, in_path))
        route_rows.append(f"{{{_lua_string(method)}, {_lua_string(_lua_pattern(template))}, {_lua_string(root)}}}")
    lines.append(f"ROUTES = {{{', '.join(route_rows)}}}")
    source = "\n".join(lines) + "\n\n" + resources.files("sie_stack").joinpath("unknown_fields.lua").read_text()
    return {
        "name": "envoy.filters.http.lua",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": source},
        },
    }


def _lua_message(
    messages: dict[str, descriptor_pb2.DescriptorProto],
    name: str,
    entry: str,
    in_path: Sequence[str] = (),
) -> str:
    """`MESSAGES[entry] = ...` for message `name`, its fields in `in_path` set apart as given by the path."""
    path_keys = {
        key
        for field in messages[name].field
        if field.name in in_path
        for key in (field.name, field.json_name or field.name)
    }
    fields = ", ".join(
        f"[{_lua_string(key)}] = {value}" for key, value in _fields(messages, name) if key not in path_keys
    )
    known = _lua_string(" ".join(field.name for field in messages[name].field if field.name not in in_path))
    # a JSON name -> the proto name, so a field given under both counts twice
    proto = ", ".join(
        f"[{_lua_string(field.json_name)}] = {_lua_string(field.name)}"
        for field in messages[name].field
        if field.json_name and field.json_name != field.name
    )
    row = f"MESSAGES[{_lua_string(entry)}] = {{fields = {{{fields}}}, known = {known}, proto = {{{proto}}}"
    if path_keys:
        row += ", in_path = {" + ", ".join(f"[{_lua_string(key)}] = true" for key in sorted(path_keys)) + "}"
    return row + "}"


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


def _reachable(messages: dict[str, descriptor_pb2.DescriptorProto], roots: list[str]) -> set[str]:
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in seen or name.startswith(_WELL_KNOWN):
            continue
        seen.add(name)
        pending.extend(f.type_name.lstrip(".") for f in messages[name].field if f.type == f.TYPE_MESSAGE)
    return {name for name in seen if not messages[name].options.map_entry}


def _fields(messages: dict[str, descriptor_pb2.DescriptorProto], name: str) -> Iterator[tuple[str, str]]:
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
        + "".join(".+" if p == "**" else "[^/]+" if p == "*" else re.sub(r"([^A-Za-z0-9])", r"%\1", p) for p in parts)
        + "$"
    )


def _lua_string(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.%^$/+\[\] -]*", text):
        raise ValueError(f"not a plain name or pattern: {text!r}")
    return f'"{text}"'
