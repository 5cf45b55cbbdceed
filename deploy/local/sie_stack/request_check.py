"""Envoy's Lua filters around the gRPC-JSON transcoder: the request check before it, the route guard after it.

The transcoder is lenient where the contract is not: it drops unknown JSON
fields without a word, reads a lone object as a one-element list, drops a
`null` list element, takes `"true"` for a boolean, parses non-strict JSON and
reads fields from a query string. The check (request_check.lua) refuses all
of that before the transcoder runs: which fields each body may hold, and the
JSON type of each, is read here from the contract's descriptor set and
written into the Lua source as tables, so the check follows `proto/`.

The check reads a JSON body chunk by chunk as it arrives, keeping each
chunk (leased from a per-thread budget) and handing the transcoder nothing
until it has the whole body and has passed it: a body holds memory only as
far as it has arrived. Envoy passes a request's headers on once a filter
reads its body that way, so the check cannot answer by then: the guard
(route_guard.lua), after the transcoder, gives its refusals once the body is
in, and the local-reply mappers the ones that end a body early (a full
budget, a body past the limit).

The guard lets a request reach a gRPC route only if the check chose that
very RPC (or saw a native gRPC call): a path the check and the transcoder
read differently is refused, never transcoded unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, NamedTuple

from google.protobuf import descriptor_pb2

# The dynamic-metadata namespace the two filters share (and the local-reply mappers read).
METADATA_NAMESPACE = "sie.edge"
# The longest path (without its query) the check reads; longer is 414 PATH_TOO_LONG. A model id is at most
# SIE_MAX_NAME_BYTES (256) bytes, so every contract path is far shorter.
MAX_PATH_BYTES = 2048
_LUA_FILTER = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
# Both filters' name: the namespace of the route metadata they read (`adapter`: a route to the HTTP adapter).
LUA_FILTER_NAME = "envoy.filters.http.lua"

_FieldType = descriptor_pb2.FieldDescriptorProto
# How the proto3 JSON mapping writes each scalar (numbers may also come as strings; the transcoder reads those).
_SCALARS = {_FieldType.TYPE_STRING: "string", _FieldType.TYPE_BYTES: "bytes", _FieldType.TYPE_BOOL: "bool"}
_SCALARS[_FieldType.TYPE_ENUM] = "enum"
# The well-known messages whose JSON form is not an object of their fields.
_WELL_KNOWN = {
    "google.protobuf.Struct": "struct",
    "google.protobuf.Value": "value",
    "google.protobuf.ListValue": "list_value",
    "google.protobuf.Any": "struct",
    "google.protobuf.Empty": "struct",
    "google.protobuf.Timestamp": "string",
    "google.protobuf.Duration": "string",
    "google.protobuf.FieldMask": "string",
    "google.protobuf.StringValue": "string",
    "google.protobuf.BytesValue": "bytes",
    "google.protobuf.BoolValue": "bool",
    **{f"google.protobuf.{kind}Value": "number" for kind in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32")},
}


class CheckedRoute(NamedTuple):
    """One google.api.http rule as the check sees it."""

    method: str  # the HTTP method
    template: str  # the path template
    message: str  # full name of the body's message, "" for a route without a body
    in_path: list[str]  # the fields of that message its path binds (the body must leave them out)
    rpc: str  # the gRPC path the transcoder turns it into (/sie.v1.Inference/Encode)


def template_parts(template: str) -> list[str]:
    """A google.api.http path template as literal parts and `*` (one segment) / `**` (the rest)."""
    template = re.sub(r"\{[^}=]+\}", "*", template)  # {name} is {name=*}
    template = re.sub(r"\{[^}=]+=([^}]*)\}", r"\1", template)
    return [part for part in re.split(r"(\*\*|\*)", template) if part]


def template_fields(template: str) -> list[str]:
    """The fields a google.api.http path template binds (`{model=**}` binds `model`)."""
    return re.findall(r"\{([^}=]+)", template)


# A JSON body may come in at most FEW_CHUNKS chunks of any size, and beyond that in chunks of MIN_CHUNK_BYTES on
# average (past it: 400 CHUNKS_TOO_SMALL): each chunk costs a resume of the check (a few microseconds), and HTTP/2 DATA
# frames of one byte would make a 16 MiB body cost a minute of an Envoy thread.
FEW_CHUNKS = 1024
MIN_CHUNK_BYTES = 256


class BodyAdmission(NamedTuple):
    """How many body bytes the check lets Envoy hold at once: it keeps each JSON body's chunks as they arrive until it
    has all of it, leasing them from its worker thread's budget as they come."""

    limit: int  # the largest body taken (larger: 413, at once from its content-length, else when it gets there)
    budget: int  # the bytes of bodies one Envoy worker thread holds at once (past it: 503 OVERLOADED)
    peer_budget: int  # the bytes of one client address's bodies one thread holds at once (past it: 503 OVERLOADED)
    bodies: int  # the bodies one thread receives at once (each request waiting for its body costs Envoy memory)
    peer_bodies: int  # the bodies of one client address one thread receives at once
    lease_s: int  # how long a body's bytes count when its request ends without a word (the request timeout and more)


def lua_filters(
    files: Iterable[descriptor_pb2.FileDescriptorProto],
    routes: Iterable[CheckedRoute],
    answers: Mapping[str, str],
    admission: BodyAdmission,
    max_header_bytes: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The check (to put before the transcoder) and the guard (after it) for `routes`. `answers`: the JSON bodies of
    Envoy's own answers the scripts give, by the Lua global they read them from (NOT_FOUND, Envoy's other 404s;
    CHECK_FAILED, a 500 for a check that never said; OVERLOADED, a 503 for a full body budget). No route takes a
    query. `max_header_bytes`: the most header bytes (name, value and 32 each) the check lets through."""
    routes = list(routes)
    messages = _messages(files)
    reachable = _reachable(messages, [route.message for route in routes if route.message])
    constants = [f"NAMESPACE = {_lua_string(METADATA_NAMESPACE)}"]
    for name, body in answers.items():
        if "]==]" in body:
            raise ValueError(f"the {name} body closes a Lua long string")
        constants.append(f"{name} = [==[{body}]==]")
    lines = [
        *constants,
        f"MAX_PATH = {MAX_PATH_BYTES}",
        f"MAX_HEADER_BYTES = {max_header_bytes}",
        f"BODY_LIMIT = {admission.limit}",
        f"BODY_BUDGET = {admission.budget}",
        f"PEER_BUDGET = {admission.peer_budget}",
        f"MAX_BODIES = {admission.bodies}",
        f"PEER_BODIES = {admission.peer_bodies}",
        f"LEASE_S = {admission.lease_s}",
        f"FEW_CHUNKS = {FEW_CHUNKS}",
        f"MIN_CHUNK = {MIN_CHUNK_BYTES}",
        "MESSAGES = {}",
    ]
    lines.extend(_lua_message(messages, name, name) for name in sorted(reachable))
    route_rows: list[str] = []
    for route in routes:
        root = route.message
        if route.in_path:
            # The transcoder lets a body field override the path's (`model`, a pool's `name`).
            root = f"{route.message} without {' '.join(route.in_path)}"
            lines.append(_lua_message(messages, route.message, root, route.in_path))
        pattern = _lua_pattern(route.template)
        route_rows.append(
            f"{{{_lua_string(route.method)}, {_lua_string(pattern)}, {_lua_string(root)}, {_lua_string(route.rpc)}}}"
        )
    lines.append(f"ROUTES = {{{', '.join(route_rows)}}}")
    check = "\n".join(lines) + "\n\n" + _source("request_check.lua")
    guard = "\n".join(constants) + "\n\n" + _source("route_guard.lua")
    return _lua(check), _lua(guard)


def _source(name: str) -> str:
    return resources.files("sie_stack").joinpath(name).read_text()


def _lua(source: str) -> dict[str, Any]:
    return {
        "name": LUA_FILTER_NAME,
        "typed_config": {"@type": _LUA_FILTER, "default_source_code": {"inline_string": source}},
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
        if name in seen or name in _WELL_KNOWN:
            continue
        seen.add(name)
        pending.extend(f.type_name.lstrip(".") for f in messages[name].field if f.type == f.TYPE_MESSAGE)
    return {name for name in seen if not messages[name].options.map_entry}


def _fields(messages: dict[str, descriptor_pb2.DescriptorProto], name: str) -> Iterator[tuple[str, str]]:
    """(JSON key, Lua value spec) of each field, under its proto name and its lowerCamel JSON name."""
    for field in messages[name].field:
        value = _lua_spec(messages, field)
        for key in dict.fromkeys((field.name, field.json_name or field.name)):
            yield key, value


def _lua_spec(messages: dict[str, descriptor_pb2.DescriptorProto], field: _FieldType) -> str:
    """What JSON a field takes, as request_check.lua reads it: a kind ("string", "bool", "number", "enum",
    "bytes", "value" for any JSON, "struct" for any object, "list_value" for any array), {message = name},
    {list = spec} or {map = spec}."""
    if field.type != field.TYPE_MESSAGE:
        single = _lua_string(_SCALARS.get(field.type, "number"))
    else:
        type_name = field.type_name.lstrip(".")
        entry = messages.get(type_name)
        if entry is not None and entry.options.map_entry:
            value = next(f for f in entry.field if f.number == 2)
            return f"{{map = {_lua_spec(messages, value)}}}"
        kind = _WELL_KNOWN.get(type_name, "value" if type_name.startswith("google.protobuf.") else None)
        single = _lua_string(kind) if kind else f"{{message = {_lua_string(type_name)}}}"
    return f"{{list = {single}}}" if field.label == field.LABEL_REPEATED else single


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
