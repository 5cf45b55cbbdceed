"""Upper bounds on every request field, checked before any work (docs/security.md, "Bounds").

Each bound is a WorkerSettings field. A request over one gets INVALID_ARGUMENT
with a reason saying what is too large and metadata naming the limit and the
setting that sets it; nothing of the request has been tokenized, decoded or
run yet. The one exception is a Work request's timeout: a longer one is cut
to SIE_MAX_REQUEST_TIMEOUT_S rather than refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf import duration_pb2, struct_pb2

from sie_common.errors import InvalidArgument
from sie_worker.postprocess import MuveraParams
from sie_worker.settings import WorkerSettings


@dataclass(frozen=True)
class Limits:
    """The bounds of one worker, read once from its settings."""

    items: int
    text_bytes: int
    instruction_bytes: int
    name_bytes: int
    labels: int
    options_bytes: int
    options_depth: int
    image_bytes: int
    image_pixels: int
    image_aspect_ratio: float
    muvera_repetitions: int
    muvera_d_proj: int
    muvera_dims: int
    request_timeout_s: float

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> Limits:
        return cls(
            items=settings.max_items_per_request,
            text_bytes=settings.max_text_bytes,
            instruction_bytes=settings.max_instruction_bytes,
            name_bytes=settings.max_name_bytes,
            labels=settings.max_labels,
            options_bytes=settings.max_options_bytes,
            options_depth=settings.max_options_depth,
            image_bytes=settings.max_image_bytes,
            image_pixels=settings.max_image_pixels,
            image_aspect_ratio=settings.max_image_aspect_ratio,
            muvera_repetitions=settings.max_muvera_repetitions,
            muvera_d_proj=settings.max_muvera_d_proj,
            muvera_dims=settings.max_muvera_dims,
            request_timeout_s=settings.max_request_timeout_s,
        )


def _over(
    message: str, *, reason: str, limit: float, setting: str, metadata: Mapping[str, str] | None = None, advice: str = ""
) -> InvalidArgument:
    """INVALID_ARGUMENT for a value over `limit`: the message and metadata name the limit and its setting."""
    shown = str(int(limit)) if float(limit).is_integer() else f"{limit:g}"
    return InvalidArgument(
        f"{message}; the limit is {shown} ({setting}){': ' + advice if advice else ''}",
        reason=reason,
        metadata={**(metadata or {}), "limit": shown, "setting": setting},
    )


def check_item_count(count: int, limits: Limits) -> None:
    if count > limits.items:
        raise _over(f"items: {count} items in one request", reason="TOO_MANY_ITEMS", limit=limits.items, setting="SIE_MAX_ITEMS_PER_REQUEST")


def _utf8_bytes(text: str, limit: int) -> int:
    """UTF-8 length of `text`, computed only when it could be over `limit` (a character is at most 4 bytes)."""
    return len(text) if len(text) * 4 <= limit else len(text.encode())


def check_text(text: str, where: str, metadata: Mapping[str, str], limits: Limits) -> None:
    """An item's (or the score query's) text: at most SIE_MAX_TEXT_BYTES."""
    size = _utf8_bytes(text, limits.text_bytes)
    if size > limits.text_bytes:
        raise _over(f"{where}: text of {size} bytes", reason="TEXT_TOO_LONG", limit=limits.text_bytes, setting="SIE_MAX_TEXT_BYTES", metadata=metadata)


def check_instruction(instruction: str, limits: Limits) -> None:
    size = _utf8_bytes(instruction, limits.instruction_bytes)
    if size > limits.instruction_bytes:
        raise _over(
            f"instruction of {size} bytes (it is prepended to every item)",
            reason="INSTRUCTION_TOO_LONG", limit=limits.instruction_bytes, setting="SIE_MAX_INSTRUCTION_BYTES",
        )


def check_name(field: str, value: str, limits: Limits) -> None:
    """A model id, profile name, LoRA name or extract label: at most SIE_MAX_NAME_BYTES."""
    size = _utf8_bytes(value, limits.name_bytes)
    if size > limits.name_bytes:
        raise _over(f"{field}: {size} bytes", reason="NAME_TOO_LONG", limit=limits.name_bytes, setting="SIE_MAX_NAME_BYTES", metadata={"field": field})


def check_labels(labels: tuple[str, ...], limits: Limits) -> None:
    if len(labels) > limits.labels:
        raise _over(f"labels: {len(labels)} labels", reason="TOO_MANY_LABELS", limit=limits.labels, setting="SIE_MAX_LABELS")
    for label in labels:
        check_name("labels", label, limits)


def check_threshold(threshold: float) -> None:
    """An extract threshold is a probability: a number in [0, 1] (NaN and infinities are not)."""
    if not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
        raise InvalidArgument(f"threshold must be a number in [0, 1], got {threshold}", reason="INVALID_THRESHOLD")


def check_options(options: struct_pb2.Struct, limits: Limits) -> None:
    """The options struct: at most SIE_MAX_OPTIONS_BYTES serialized, objects and lists at most SIE_MAX_OPTIONS_DEPTH deep.

    Walked without recursion, before anything converts it."""
    size = options.ByteSize()
    if size > limits.options_bytes:
        raise _over(f"options: {size} bytes", reason="OPTIONS_TOO_LARGE", limit=limits.options_bytes, setting="SIE_MAX_OPTIONS_BYTES")
    pending: list[tuple[struct_pb2.Struct | struct_pb2.ListValue, int]] = [(options, 1)]
    while pending:
        container, depth = pending.pop()
        if depth > limits.options_depth:
            raise _over(
                f"options: nested {depth} levels deep", reason="OPTIONS_TOO_LARGE", limit=limits.options_depth, setting="SIE_MAX_OPTIONS_DEPTH"
            )
        values = container.fields.values() if isinstance(container, struct_pb2.Struct) else container.values
        for value in values:
            kind = value.WhichOneof("kind")
            if kind == "struct_value":
                pending.append((value.struct_value, depth + 1))
            elif kind == "list_value":
                pending.append((value.list_value, depth + 1))


def check_muvera(params: MuveraParams, limits: Limits) -> None:
    """MUVERA parameters (the profile's merged with the request's) within the worker's bounds: INVALID_OPTIONS."""
    for name, value, limit, setting in (
        ("repetitions", params.repetitions, limits.muvera_repetitions, "SIE_MAX_MUVERA_REPETITIONS"),
        ("d_proj", params.d_proj, limits.muvera_d_proj, "SIE_MAX_MUVERA_D_PROJ"),
        ("dims", params.dims, limits.muvera_dims, "SIE_MAX_MUVERA_DIMS"),
    ):
        if value > limit:
            what = "repetitions x 2^k_sim x d_proj" if name == "dims" else name
            raise _over(f"options: muvera {what} is {value}", reason="INVALID_OPTIONS", limit=limit, setting=setting, metadata={"parameter": name})


def check_image_bytes(size: int, where: str, metadata: Mapping[str, str], limits: Limits) -> None:
    if size > limits.image_bytes:
        raise _over(
            f"{where}: image of {size} bytes", reason="IMAGE_TOO_LARGE", limit=limits.image_bytes, setting="SIE_MAX_IMAGE_BYTES", metadata=metadata,
            advice="compress or downscale it",
        )


def check_image_size(width: int, height: int, resized_pixels: int, where: str, metadata: Mapping[str, str], limits: Limits) -> None:
    """An image's size from its header, and the size the model's processor would resize it to, before any pixel is decoded.

    Decoded, an image takes at most 4 bytes a pixel (RGBA, CMYK, 32-bit modes), so the pixel bound bounds its memory too."""
    pixel_metadata = {**metadata, "max_pixels": str(limits.image_pixels)}
    if width * height > limits.image_pixels:
        raise _over(
            f"{where}: image too large ({width}x{height} is {width * height} pixels)",
            reason="IMAGE_TOO_LARGE", limit=limits.image_pixels, setting="SIE_MAX_IMAGE_PIXELS", metadata=pixel_metadata, advice="downscale it",
        )
    ratio = max(width, height) / max(min(width, height), 1)
    if ratio > limits.image_aspect_ratio:
        raise _over(
            f"{where}: image of {width}x{height} has an aspect ratio of {ratio:.0f}",
            reason="IMAGE_ASPECT_RATIO_TOO_LARGE", limit=limits.image_aspect_ratio, setting="SIE_MAX_IMAGE_ASPECT_RATIO", metadata=metadata,
            advice="crop or pad it",
        )
    if resized_pixels > limits.image_pixels:
        raise _over(
            f"{where}: the model's processor would resize the {width}x{height} image to {resized_pixels} pixels",
            reason="IMAGE_TOO_LARGE", limit=limits.image_pixels, setting="SIE_MAX_IMAGE_PIXELS", metadata=pixel_metadata, advice="crop or pad it",
        )


def work_timeout(timeout: duration_pb2.Duration, limits: Limits) -> float:
    """A Work request's timeout in seconds, cut to SIE_MAX_REQUEST_TIMEOUT_S (0 or less: already expired).

    Read from the fields as they are: any int64 seconds is a number here, where Duration.ToTimedelta overflows."""
    return min(timeout.seconds + timeout.nanos / 1e9, limits.request_timeout_s)
