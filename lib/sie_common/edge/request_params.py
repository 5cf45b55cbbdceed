"""One request shape from the three ways a parameter may arrive: a field, `params.<field>`, or `options.<key>`.

The reference API sends its parameters grouped under `params` (over HTTP) and
some of them as `options` keys (`is_query`, `lora`, `instruction`, `profile`,
as its SDK and integrations do). `merged_request` folds both into the request's
own fields, so everything after it (bounds, routing, the batch key) reads one
place: equal requests compare equal however they were written. A parameter
given in two places with different values is INVALID_ARGUMENT
(`CONFLICTING_OPTIONS`) naming both; a field left at its default counts as not
given (proto3 cannot tell `false` from unset on a plain field), and so does
such an option key set to null (`options={"lora": None}`), as null does
for the field.

The gateway and the worker both apply it, then check the merged request's
bounds (`request_bounds.check_request`); only what is folded is bounded before
(the options as sent, so a huge `options.instruction` is OPTIONS_TOO_LARGE).
A merged request has no `params` and none of those option keys, so applying it
twice changes nothing.
"""

from __future__ import annotations

import math
import struct
from typing import Any, TypeVar

from google.protobuf import descriptor, struct_pb2

from sie_common.edge.errors import InvalidArgument, clipped
from sie_common.edge.request_bounds import RequestBounds, check_options

# options keys that stand for a request field of the same name, and the JSON type they must have.
OPTION_FIELDS: dict[str, type] = {
    "is_query": bool,
    "lora": str,
    "instruction": str,
    "profile": str,
}

Request = TypeVar("Request")


def merged_request(request: Request, bounds: RequestBounds) -> Request:
    """`request` with `params` and the field-like `options` keys folded into its fields (a copy when anything moved)."""
    message: Any = request
    params = message.params if message.HasField("params") else None
    aliases = [key for key in OPTION_FIELDS if key in message.DESCRIPTOR.fields_by_name]
    if params is None and not any(key in message.options.fields for key in aliases):
        return request  # nothing to fold: the request's bounds are checked on it as it is
    check_options(message.options, bounds)
    if params is not None:
        check_options(params.options, bounds)
    merged = type(message)()
    merged.CopyFrom(message)
    merged.ClearField("params")
    # field -> (value, where) of what params and options set, an explicit `false` too
    given: dict[str, tuple[Any, str]] = {}
    if params is not None:
        _fold_params(merged, params, given)
    for key in aliases:
        if key in merged.options.fields:
            _fold_option(merged, key, given)
    return merged


def _fold_params(request: Any, params: Any, given: dict[str, tuple[Any, str]]) -> None:
    for field in params.DESCRIPTOR.fields:
        if field.name == "options":
            _merge_options(request.options, params.options)
        elif _is_set(params, field):
            _set(
                request,
                field.name,
                getattr(params, field.name),
                f"params.{field.name}",
                given,
            )


def _merge_options(options: struct_pb2.Struct, extra: struct_pb2.Struct) -> None:
    for key, value in extra.fields.items():
        if key in options.fields and options.fields[key] != value:
            raise _conflict(f"options.{clipped(key)}", f"params.options.{clipped(key)}")
        options.fields[key].CopyFrom(value)


def _fold_option(request: Any, key: str, given: dict[str, tuple[Any, str]]) -> None:
    value: Any = request.options.fields[key]
    expected = OPTION_FIELDS[key]
    kind = value.WhichOneof("kind")
    if kind == "null_value":  # not given, as JSON null is for the field itself
        del request.options.fields[key]
        return
    if expected is bool and kind == "bool_value":
        value = value.bool_value
    elif expected is str and kind == "string_value":
        value = value.string_value
    else:
        wanted = "true or false" if expected is bool else "a string"
        raise InvalidArgument(
            f"options.{key} must be {wanted} (it stands for the request's {key} field)",
            reason="INVALID_OPTIONS",
            metadata={"option": key},
        )
    del request.options.fields[key]
    _set(request, key, value, f"options.{key}", given)


def _set(request: Any, name: str, value: Any, source: str, given: dict[str, tuple[Any, str]]) -> None:
    """Set field `name` to `value` (from `source`) unless it holds, or was given, another value already."""
    field = request.DESCRIPTOR.fields_by_name[name]
    if name in given:
        if not _same(given[name][0], _value_of(field, value)):
            raise _conflict(given[name][1], source)
    elif _is_set(request, field) and not _same(_value(request, field), _value_of(field, value)):
        raise _conflict(name, source)
    given[name] = (_value_of(field, value), source)
    if field.is_repeated:
        del getattr(request, name)[:]
        getattr(request, name).extend(value)
    else:
        setattr(request, name, value)


def _is_set(message: Any, field: descriptor.FieldDescriptor) -> bool:
    if field.is_repeated:
        return len(getattr(message, field.name)) > 0
    if field.has_presence:
        return message.HasField(field.name)
    return getattr(message, field.name) != field.default_value


def _value(message: Any, field: descriptor.FieldDescriptor) -> Any:
    return _value_of(field, getattr(message, field.name))


def _value_of(field: descriptor.FieldDescriptor, value: Any) -> Any:
    """A comparable form: repeated fields as lists, floats at the field's own (32-bit) precision."""
    if field.is_repeated:
        return list(value)
    if field.type == descriptor.FieldDescriptor.TYPE_FLOAT:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN to NaN too: the same NaN in two places is the bound's to refuse (INVALID_THRESHOLD), not a
    conflict."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _conflict(field: str, other: str) -> InvalidArgument:
    return InvalidArgument(
        f"{field} and {other} disagree; set one of them (or the same value in both)",
        reason="CONFLICTING_OPTIONS",
        metadata={"field": field, "other": other},
    )
