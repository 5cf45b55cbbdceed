"""The worker's upper bounds on a request, checked before any work (docs/security.md, "Bounds").

The bounds on a message's own fields (items, texts, names, options, labels, image bytes) live in
sie_common.edge.request_bounds, which the gateway checks too; here are those that need the model: MUVERA
parameters, image sizes read from the header, and the multivectors an encode or score holds. Each bound is a
WorkerSettings field. A request over one gets INVALID_ARGUMENT with a reason saying what is too large and metadata
naming the limit and the setting that sets it; nothing of the request has been tokenized, decoded or run yet (a
score's multivectors are counted from its tokens: tokenized, never run). The one exception is a Work request's
timeout: a longer one is cut to SIE_MAX_REQUEST_TIMEOUT_S rather than refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sie_common.edge.request_bounds import RequestBounds, over_limit
from sie_worker.engine.postprocess import MuveraParams
from sie_worker.settings import WorkerSettings


@dataclass(frozen=True)
class Limits(RequestBounds):
    """The bounds of one worker, read once from its settings: those the gateway checks too, and the model-bound ones."""

    image_pixels: int
    request_image_pixels: int
    image_aspect_ratio: float
    jpeg_scans: int
    muvera_repetitions: int
    muvera_d_proj: int
    muvera_dims: int
    score_multivector_bytes: int
    request_timeout_s: float

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> Limits:
        return cls(
            **RequestBounds.fields_from(settings),
            image_pixels=settings.max_image_pixels,
            request_image_pixels=settings.max_request_image_pixels,
            image_aspect_ratio=settings.max_image_aspect_ratio,
            jpeg_scans=settings.max_jpeg_scans,
            muvera_repetitions=settings.max_muvera_repetitions,
            muvera_d_proj=settings.max_muvera_d_proj,
            muvera_dims=settings.max_muvera_dims,
            score_multivector_bytes=settings.max_score_multivector_bytes,
            request_timeout_s=settings.max_request_timeout_s,
        )


def check_muvera(params: MuveraParams, limits: Limits) -> None:
    """MUVERA parameters (the profile's merged with the request's) within the worker's bounds: INVALID_OPTIONS."""
    for name, value, limit, setting in (
        ("repetitions", params.repetitions, limits.muvera_repetitions, "SIE_MAX_MUVERA_REPETITIONS"),
        ("d_proj", params.d_proj, limits.muvera_d_proj, "SIE_MAX_MUVERA_D_PROJ"),
        ("dims", params.dims, limits.muvera_dims, "SIE_MAX_MUVERA_DIMS"),
    ):
        if value > limit:
            what = "repetitions x 2^k_sim x d_proj" if name == "dims" else name
            raise over_limit(
                f"options: muvera {what} is {value}",
                reason="INVALID_OPTIONS",
                limit=limit,
                setting=setting,
                metadata={"parameter": name},
            )


def check_held_multivectors(rows: int, dims: int, limits: Limits, task: str) -> None:
    """An encode or score holds its items' multivectors (float32) until every item is through: `rows` vectors of
    `dims` within SIE_MAX_SCORE_MULTIVECTOR_BYTES, checked once they are tokenized, before the forward pass. An encode's
    answer may be far smaller than what it holds (MUVERA, a binary output dtype), so its size bound does not cover
    it."""
    size = rows * dims * 4
    if size > limits.score_multivector_bytes:
        score = task == "score"
        raise over_limit(
            f"items: {rows} multivectors of {dims} dims ({size} bytes) to {task}",
            reason="SCORE_TOO_LARGE" if score else "MULTIVECTORS_TOO_LARGE",
            limit=limits.score_multivector_bytes,
            setting="SIE_MAX_SCORE_MULTIVECTOR_BYTES",
            advice="score fewer or shorter items per request, or in dense or sparse mode"
            if score
            else "encode fewer or shorter items per request",
        )


def check_image_size(
    width: int, height: int, resized_pixels: int, where: str, metadata: Mapping[str, str], limits: Limits
) -> None:
    """An image's size from its header, and the size the model's processor would resize it to, before any pixel is
    decoded.

    Decoded, an image takes at most 4 bytes a pixel (RGBA, CMYK, 32-bit modes), so the pixel bound bounds its memory
    too."""
    pixel_metadata = {**metadata, "max_pixels": str(limits.image_pixels)}
    if width * height > limits.image_pixels:
        raise over_limit(
            f"{where}: image too large ({width}x{height} is {width * height} pixels)",
            reason="IMAGE_TOO_LARGE",
            limit=limits.image_pixels,
            setting="SIE_MAX_IMAGE_PIXELS",
            metadata=pixel_metadata,
            advice="downscale it",
        )
    ratio = max(width, height) / max(min(width, height), 1)
    if ratio > limits.image_aspect_ratio:
        raise over_limit(
            f"{where}: image of {width}x{height} has an aspect ratio of {ratio:.0f}",
            reason="IMAGE_ASPECT_RATIO_TOO_LARGE",
            limit=limits.image_aspect_ratio,
            setting="SIE_MAX_IMAGE_ASPECT_RATIO",
            metadata=metadata,
            advice="crop or pad it",
        )
    if resized_pixels > limits.image_pixels:
        raise over_limit(
            f"{where}: the model's processor would resize the {width}x{height} image to {resized_pixels} pixels",
            reason="IMAGE_TOO_LARGE",
            limit=limits.image_pixels,
            setting="SIE_MAX_IMAGE_PIXELS",
            metadata=pixel_metadata,
            advice="crop or pad it",
        )


def check_request_pixels(pixels: int, images: int, limits: Limits) -> None:
    """The pixels of a request's images together (each decoded, plus as its processor resizes it), read from their
    headers: every image of a request is decoded and processed before its first forward pass, and held until the
    request answers."""
    if pixels > limits.request_image_pixels:
        raise over_limit(
            f"items: {images} images take {pixels} pixels decoded and resized",
            reason="REQUEST_IMAGES_TOO_LARGE",
            limit=limits.request_image_pixels,
            setting="SIE_MAX_REQUEST_IMAGE_PIXELS",
            advice="send fewer or smaller images per request",
        )


# A marker: 0xFF, any fill 0xFFs, then its code. Possessive, and a search starts only where a run of 0xFF
# does: linear in the data, however it is made.
_MARKER = re.compile(rb"\xff++(.)", re.DOTALL)
# The next marker after a scan's entropy-coded data: one whose code is neither a stuffed zero nor a restart
# marker (RSTn, 0xD0-0xD7); those belong to the scan.
_AFTER_SCAN = re.compile(rb"(?<!\xff)\xff++[^\x00\xd0-\xd7]")
# Markers that stand alone, with no length field: TEM, RSTn, SOI.
_STANDALONE = frozenset((0x01, *range(0xD0, 0xD9)))


# Markers (segments and scans) a JPEG may have per scan allowed: a real one has a few (tables, APP data).
JPEG_MARKERS_PER_SCAN = 16


def jpeg_scans(data: bytes, limit: int) -> int:
    """The scans (SOS markers) of a JPEG file, counted up to `limit` + 1, from its markers alone; a file of
    more than JPEG_MARKERS_PER_SCAN x `limit` markers counts as `limit` + 1, so the walk stays short.

    Segments are stepped over by their length (an APP segment may hold any bytes), a scan's
    entropy-coded data by searching for the marker after it; nothing is decoded."""
    scans, markers, position, end = 0, 0, 2, len(data)
    while position < end and scans <= limit:
        if markers > JPEG_MARKERS_PER_SCAN * limit:
            return limit + 1
        if data[position] != 0xFF:  # not at a marker (a corrupt file): libjpeg skips to the next one
            found = data.find(b"\xff", position)
            position = found if found >= 0 else end
            continue
        marker = _MARKER.match(data, position)
        if marker is None:  # nothing but fill to the end
            break
        code, position = marker.group(1)[0], marker.end()
        markers += 1
        if code == 0xD9:  # EOI
            break
        if code in _STANDALONE:
            continue
        position += int.from_bytes(data[position : position + 2], "big")
        if code == 0xDA:
            scans += 1
            after = _AFTER_SCAN.search(data, position)
            position = after.start() if after else end
    return scans


def check_jpeg_scans(data: bytes, where: str, metadata: Mapping[str, str], limits: Limits) -> None:
    """A JPEG's scans within SIE_MAX_JPEG_SCANS: libjpeg runs every scan over the whole image, so a small
    progressive file of many empty scans costs minutes of CPU to decode."""
    scans = jpeg_scans(data, limits.jpeg_scans)
    if scans > limits.jpeg_scans:
        raise over_limit(
            f"{where}: JPEG of more than {limits.jpeg_scans} scans (or {JPEG_MARKERS_PER_SCAN} times as many markers)",
            reason="IMAGE_TOO_MANY_SCANS",
            limit=limits.jpeg_scans,
            setting="SIE_MAX_JPEG_SCANS",
            metadata=metadata,
            advice="re-encode it (a progressive JPEG has about 10)",
        )
