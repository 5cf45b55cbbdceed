"""Upper bounds on a request message's own fields, checked before any work (docs/security.md, "Bounds").

The gateway and the worker read the same settings (`RequestBoundSettings`,
which both services' settings extend) and check a request with the same
functions: the gateway before it routes, the worker always, whichever way the
request reached it. A request over a bound gets INVALID_ARGUMENT with a reason
saying what is too large and ErrorInfo metadata naming the limit and the
setting that sets it. Bounds that need the model (MUVERA parameters, image
sizes after decoding the header, token counts) are the worker's alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2

from sie_common.edge.errors import InvalidArgument
from sie_common.runtime.settings import SettingsError, setting


@dataclass(frozen=True)
class RequestBoundSettings:
    """The settings of the bounds both the gateway and the worker check; each service's settings extend it."""

    max_items_per_request: int = setting(
        8192, env="SIE_MAX_ITEMS_PER_REQUEST", help="most items in one encode, score or extract request"
    )
    max_text_bytes: int = setting(
        2 * 2**20,
        env="SIE_MAX_TEXT_BYTES",
        help="longest item text (and score query) accepted, in UTF-8 bytes; the model truncates what it reads to its "
        "token limit",
    )
    max_instruction_bytes: int = setting(
        16384,
        env="SIE_MAX_INSTRUCTION_BYTES",
        help="longest instruction accepted, in UTF-8 bytes (it is prepended to every item)",
    )
    max_name_bytes: int = setting(
        256,
        env="SIE_MAX_NAME_BYTES",
        help="longest model id, profile name, LoRA name and extract label accepted (on a gateway also pool names, "
        "bundles, machine profiles and routing headers), in UTF-8 bytes",
    )
    max_labels: int = setting(128, env="SIE_MAX_LABELS", help="most labels in one extract request")
    max_options_bytes: int = setting(
        16384, env="SIE_MAX_OPTIONS_BYTES", help="largest options struct accepted, in serialized protobuf bytes"
    )
    max_options_depth: int = setting(
        8, env="SIE_MAX_OPTIONS_DEPTH", help="deepest nesting of objects and lists accepted in options"
    )
    max_image_bytes: int = setting(
        10 * 2**20, env="SIE_MAX_IMAGE_BYTES", help="largest encoded image accepted, in bytes"
    )
    max_metadata_bytes: int = setting(
        16384,
        env="SIE_MAX_METADATA_BYTES",
        help="largest item metadata struct accepted, in serialized protobuf bytes (at most SIE_MAX_OPTIONS_DEPTH deep)",
    )

    def __post_init__(self) -> None:
        for field in dataclasses.fields(RequestBoundSettings):
            value = getattr(self, field.name)
            if value <= 0:
                raise SettingsError(f"{field.metadata['env']}={value}: must be positive")


@dataclass(frozen=True)
class RequestBounds:
    """The bounds of one service, read once from its settings."""

    items: int
    text_bytes: int
    instruction_bytes: int
    name_bytes: int
    labels: int
    options_bytes: int
    options_depth: int
    image_bytes: int
    metadata_bytes: int

    @staticmethod
    def fields_from(settings: RequestBoundSettings) -> dict[str, Any]:
        """The keyword arguments of these bounds, from `settings` (for subclasses that add their own)."""
        return {
            "items": settings.max_items_per_request,
            "text_bytes": settings.max_text_bytes,
            "instruction_bytes": settings.max_instruction_bytes,
            "name_bytes": settings.max_name_bytes,
            "labels": settings.max_labels,
            "options_bytes": settings.max_options_bytes,
            "options_depth": settings.max_options_depth,
            "image_bytes": settings.max_image_bytes,
            "metadata_bytes": settings.max_metadata_bytes,
        }


# Fixed bounds of short strings that name a thing (docs/security.md, "Bounds"): an image's format hint ("jpeg",
# "image/webp") and the OpenAI embeddings `user` (an end-user id).
MAX_IMAGE_FORMAT_BYTES = 32
MAX_USER_BYTES = 256


def over_limit(
    message: str,
    *,
    reason: str,
    limit: float,
    setting: str,
    metadata: Mapping[str, str] | None = None,
    advice: str = "",
) -> InvalidArgument:
    """INVALID_ARGUMENT for a value over `limit`: the message and metadata name the limit and its setting."""
    shown = str(int(limit)) if float(limit).is_integer() else f"{limit:g}"
    return InvalidArgument(
        f"{message}; the limit is {shown} ({setting}){': ' + advice if advice else ''}",
        reason=reason,
        metadata={**(metadata or {}), "limit": shown, "setting": setting},
    )


def check_item_count(count: int, bounds: RequestBounds) -> None:
    if count > bounds.items:
        raise over_limit(
            f"items: {count} items in one request",
            reason="TOO_MANY_ITEMS",
            limit=bounds.items,
            setting="SIE_MAX_ITEMS_PER_REQUEST",
        )


def _utf8_bytes(text: str, limit: int) -> int:
    """UTF-8 length of `text`, computed only when it could be over `limit` (a character is at most 4 bytes)."""
    return len(text) if len(text) * 4 <= limit else len(text.encode())


def check_text(text: str, where: str, metadata: Mapping[str, str], bounds: RequestBounds) -> None:
    """An item's (or the score query's) text: at most SIE_MAX_TEXT_BYTES."""
    size = _utf8_bytes(text, bounds.text_bytes)
    if size > bounds.text_bytes:
        raise over_limit(
            f"{where}: text of {size} bytes",
            reason="TEXT_TOO_LONG",
            limit=bounds.text_bytes,
            setting="SIE_MAX_TEXT_BYTES",
            metadata=metadata,
        )


def check_instruction(instruction: str, bounds: RequestBounds) -> None:
    size = _utf8_bytes(instruction, bounds.instruction_bytes)
    if size > bounds.instruction_bytes:
        raise over_limit(
            f"instruction of {size} bytes (it is prepended to every item)",
            reason="INSTRUCTION_TOO_LONG",
            limit=bounds.instruction_bytes,
            setting="SIE_MAX_INSTRUCTION_BYTES",
        )


def check_name(
    field: str,
    value: str,
    bounds: RequestBounds,
    reason: str = "NAME_TOO_LONG",
    metadata: Mapping[str, str] | None = None,
) -> None:
    """A model id, profile name, LoRA name, extract label or a struct's key: at most SIE_MAX_NAME_BYTES."""
    size = _utf8_bytes(value, bounds.name_bytes)
    if size > bounds.name_bytes:
        raise over_limit(
            f"{field}: {size} bytes",
            reason=reason,
            limit=bounds.name_bytes,
            setting="SIE_MAX_NAME_BYTES",
            metadata={**(metadata or {}), "field": field},
        )


def check_labels(labels: Sequence[str], bounds: RequestBounds) -> None:
    if len(labels) > bounds.labels:
        raise over_limit(
            f"labels: {len(labels)} labels", reason="TOO_MANY_LABELS", limit=bounds.labels, setting="SIE_MAX_LABELS"
        )
    for label in labels:
        check_name("labels", label, bounds)


def check_threshold(threshold: float) -> None:
    """An extract threshold is a probability: a number in [0, 1] (NaN and infinities are not)."""
    if not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
        raise InvalidArgument(f"threshold must be a number in [0, 1], got {threshold}", reason="INVALID_THRESHOLD")


def check_dims(dims: int, field: str = "dims") -> None:
    """Matryoshka truncation keeps the first `dims` values: a positive count (the upper bound is the model's, once
    it is loaded: DIMS_TOO_LARGE). Checked before the answer-size estimate, which reads it."""
    if dims <= 0:
        raise InvalidArgument(f"{field} must be positive, got {dims}", reason="INVALID_DIMS", metadata={"field": field})


def check_options(options: struct_pb2.Struct, bounds: RequestBounds) -> None:
    """The options struct: at most SIE_MAX_OPTIONS_BYTES serialized, objects and lists at most SIE_MAX_OPTIONS_DEPTH
    deep, each key (at any depth) at most SIE_MAX_NAME_BYTES: an option's name is a name.

    Walked without recursion, before anything converts it."""
    _check_struct(options, "options", "OPTIONS_TOO_LARGE", bounds.options_bytes, "SIE_MAX_OPTIONS_BYTES", {}, bounds)


def check_item_fields(item: Any, where: str, metadata: Mapping[str, str], bounds: RequestBounds) -> None:
    """An item's `metadata` (at most SIE_MAX_METADATA_BYTES serialized, SIE_MAX_OPTIONS_DEPTH deep, keys at most
    SIE_MAX_NAME_BYTES) and its images' format hints (at most MAX_IMAGE_FORMAT_BYTES). Text and image sizes are
    checked where they are read (check_text, check_image_bytes)."""
    if item.HasField("metadata"):
        _check_struct(
            item.metadata,
            f"{where}: metadata",
            "METADATA_TOO_LARGE",
            bounds.metadata_bytes,
            "SIE_MAX_METADATA_BYTES",
            metadata,
            bounds,
        )
    for image in item.images:
        size = _utf8_bytes(image.format, MAX_IMAGE_FORMAT_BYTES)
        if size > MAX_IMAGE_FORMAT_BYTES:
            raise over_limit(
                f"{where}: an image format hint of {size} bytes (it names a format: jpeg, png, webp)",
                reason="IMAGE_FORMAT_TOO_LONG",
                limit=MAX_IMAGE_FORMAT_BYTES,
                setting="fixed",
                metadata=metadata,
            )


def check_user(user: str) -> None:
    """The OpenAI embeddings `user` (an end-user id): at most MAX_USER_BYTES."""
    size = _utf8_bytes(user, MAX_USER_BYTES)
    if size > MAX_USER_BYTES:
        raise over_limit(f"user: {size} bytes", reason="USER_TOO_LONG", limit=MAX_USER_BYTES, setting="fixed")


def _check_struct(
    struct: struct_pb2.Struct,
    where: str,
    reason: str,
    limit: int,
    setting: str,
    metadata: Mapping[str, str],
    bounds: RequestBounds,
) -> None:
    """A free-form struct: at most `limit` serialized bytes (`setting`), SIE_MAX_OPTIONS_DEPTH deep, its keys at most
    SIE_MAX_NAME_BYTES. Walked without recursion."""
    size = struct.ByteSize()
    if size > limit:
        raise over_limit(f"{where}: {size} bytes", reason=reason, limit=limit, setting=setting, metadata=metadata)
    pending: list[tuple[struct_pb2.Struct | struct_pb2.ListValue, int]] = [(struct, 1)]
    while pending:
        container, depth = pending.pop()
        if depth > bounds.options_depth:
            raise over_limit(
                f"{where}: nested {depth} levels deep",
                reason=reason,
                limit=bounds.options_depth,
                setting="SIE_MAX_OPTIONS_DEPTH",
                metadata=metadata,
            )
        if isinstance(container, struct_pb2.Struct):
            for key in container.fields:
                check_name(f"{where} key", key, bounds, "KEY_TOO_LONG", metadata)
        values = container.fields.values() if isinstance(container, struct_pb2.Struct) else container.values
        for value in values:
            kind = value.WhichOneof("kind")
            if kind == "struct_value":
                pending.append((value.struct_value, depth + 1))
            elif kind == "list_value":
                pending.append((value.list_value, depth + 1))


def check_image_bytes(size: int, where: str, metadata: Mapping[str, str], bounds: RequestBounds) -> None:
    if size > bounds.image_bytes:
        raise over_limit(
            f"{where}: image of {size} bytes",
            reason="IMAGE_TOO_LARGE",
            limit=bounds.image_bytes,
            setting="SIE_MAX_IMAGE_BYTES",
            metadata=metadata,
            advice="compress or downscale it",
        )


def check_request(request: Any, bounds: RequestBounds) -> None:
    """Every bounded field of an EncodeRequest, ScoreRequest or ExtractRequest, as the message holds it.

    For the gateway, before it routes; the worker checks the same fields as it reads them."""
    check_name("model", request.model, bounds)
    check_name("profile", request.profile, bounds)
    check_name("lora", request.lora, bounds)
    check_options(request.options, bounds)
    check_item_count(len(request.items), bounds)
    fields = request.DESCRIPTOR.fields_by_name
    items = [(f"items[{index}]", {"item": str(index)}, item) for index, item in enumerate(request.items)]
    if "query" in fields:
        items.append(("query", {"item": "query"}, request.query))
    for where, metadata, item in items:
        if item.HasField("text"):
            check_text(item.text, where, metadata, bounds)
        for image in item.images:
            check_image_bytes(len(image.data), where, metadata, bounds)
        check_item_fields(item, where, metadata, bounds)
    if "instruction" in fields and request.HasField("instruction"):
        check_instruction(request.instruction, bounds)
    if "labels" in fields:
        check_labels(request.labels, bounds)
    if "threshold" in fields and request.HasField("threshold"):
        check_threshold(request.threshold)
    if "dims" in fields and request.HasField("dims"):
        check_dims(request.dims)
