"""Decoding the images of request items, within the limits that keep a worker safe from them.

JPEG, PNG and WebP are accepted; the bytes decide the format. An item's
`format`, when set, must name one of them (`jpeg`/`jpg`, `png`, `webp`, or
their `image/...` MIME types); a supported hint that disagrees with the bytes
is ignored. The file's size was checked with the request's own fields
(SIE_MAX_IMAGE_BYTES, sie_common.edge.request_bounds); each header is read
once: its width and height against SIE_MAX_IMAGE_PIXELS and
SIE_MAX_IMAGE_ASPECT_RATIO, the size the model's processor would resize
the image to against SIE_MAX_IMAGE_PIXELS, the request's images together
against SIE_MAX_REQUEST_IMAGE_PIXELS; then a JPEG's scans against
SIE_MAX_JPEG_SCANS, all before any pixel is decoded
(sie_worker.engine.limits): a small file that claims a huge image (a decompression
bomb), or a thin one that the processor would blow up (1 x 1,000,000 resized
to a 224-pixel short edge), or a progressive JPEG of thousands of empty scans
(each of which libjpeg runs over the whole image), is refused at the cost of
reading its header or its markers.
Every refusal is INVALID_ARGUMENT naming the item and the image.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from sie_common.edge.errors import InvalidArgument
from sie_worker.engine.jobs import ImageInput, ItemInput
from sie_worker.engine.limits import Limits, check_image_size, check_jpeg_scans, check_request_pixels

# Pillow's format name -> the names a `format` hint may use for it.
FORMATS = {"JPEG": ("jpeg", "jpg"), "PNG": ("png",), "WEBP": ("webp",)}
_HINTS = {hint: name for name, hints in FORMATS.items() for hint in hints}
SUPPORTED = "JPEG, PNG or WebP"

# SIE_MAX_IMAGE_PIXELS is the limit here; Pillow's warning for large headers would only repeat it in the log.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)


@dataclass(frozen=True)
class ImageHeader:
    """An item's image with its header read (nothing decoded yet): opened, or the refusal that names it; and the
    pixels it counts against the request's bound (decoded plus as its processor resizes it; 0 where it is over a
    bound of its own, or its header does not read)."""

    item: ItemInput
    opened: Image.Image | None
    refusal: InvalidArgument | None
    pixels: int


def read_headers(
    items: Sequence[ItemInput], *, limits: Limits, resized_pixels: Callable[[int, int], int]
) -> list[ImageHeader]:
    """The first image of each item read up to its header, each checked against the bounds of one image
    (SIE_MAX_IMAGE_PIXELS, SIE_MAX_IMAGE_ASPECT_RATIO, the size the processor resizes it to), and together
    against SIE_MAX_REQUEST_IMAGE_PIXELS: every image of a request is decoded and processed before its first
    forward pass, and held until the request answers. The request's refusal comes before any image's.

    `resized_pixels(width, height)`: the pixels the model's processor resizes an image of that size to."""
    headers = [_header(item, limits, resized_pixels) for item in items]
    counted = [header for header in headers if header.pixels]
    check_request_pixels(sum(header.pixels for header in counted), len(counted), limits)
    return headers


def _header(item: ItemInput, limits: Limits, resized_pixels: Callable[[int, int], int]) -> ImageHeader:
    image = item.images[0]
    where = f"{item.label}: images[0]"
    metadata = {**item.metadata, "image": "0"}
    try:
        opened = Image.open(io.BytesIO(image.data), formats=tuple(FORMATS))
    except Image.DecompressionBombError:  # Pillow's own guard: the header claims over twice Image.MAX_IMAGE_PIXELS
        detail = f"more than {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels"
        return _refused(item, image, where, metadata, _too_large(where, metadata, limits.image_pixels, detail))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        return _refused(item, image, where, metadata, _unreadable(image.data, where, metadata, error))
    width, height = opened.size
    resized = resized_pixels(width, height)
    try:
        check_image_size(width, height, resized, where, metadata, limits)
    except InvalidArgument as refusal:
        return _refused(item, image, where, metadata, refusal)
    return _refused(item, image, where, metadata, None, opened, width * height + resized)


def _refused(
    item: ItemInput,
    image: ImageInput,
    where: str,
    metadata: dict[str, str],
    refusal: InvalidArgument | None,
    opened: Image.Image | None = None,
    pixels: int = 0,
) -> ImageHeader:
    """The header, its refusal the format hint's where that is not one the worker takes (the hint is read first)."""
    try:
        _check_hint(image, where, metadata)
    except InvalidArgument as hinted:
        refusal = hinted
    return ImageHeader(item, None if refusal else opened, refusal, pixels)


def decode(header: ImageHeader, *, limits: Limits) -> Image.Image:
    """The image of a header that read, decoded in its own mode (the model's processor converts it) and turned as
    its EXIF orientation says; a JPEG's scans are counted first (SIE_MAX_JPEG_SCANS)."""
    if header.refusal is not None or header.opened is None:
        raise header.refusal or ValueError("no image")
    opened, item = header.opened, header.item
    where = f"{item.label}: images[0]"
    metadata = {**item.metadata, "image": "0"}
    if opened.format == "JPEG":
        check_jpeg_scans(item.images[0].data, where, metadata, limits)
    try:
        opened.load()
        # Upright, as transformers' own image loading (and every viewer) turns it: a phone photo is stored sideways.
        ImageOps.exif_transpose(opened, in_place=True)
    except Exception as error:  # noqa: BLE001 - Pillow's decoders raise OSError, ValueError, SyntaxError, struct.error, ...
        raise InvalidArgument(
            f"{where}: the {opened.format} data cannot be decoded ({error}); send a complete {SUPPORTED} file",
            reason="INVALID_IMAGE",
            metadata=metadata,
        ) from None
    return opened


def _check_hint(image: ImageInput, where: str, metadata: dict[str, str]) -> None:
    hint = image.format.strip().lower().removeprefix("image/")
    if hint and hint not in _HINTS:
        raise InvalidArgument(
            f"{where}: format {image.format!r} is not supported; send {SUPPORTED}",
            reason="UNSUPPORTED_IMAGE_FORMAT",
            metadata={**metadata, "format": image.format},
        )


def _too_large(where: str, metadata: dict[str, str], max_pixels: int, detail: str) -> InvalidArgument:
    return InvalidArgument(
        f"{where}: image too large ({detail}); the limit is {max_pixels} pixels (SIE_MAX_IMAGE_PIXELS): downscale it",
        reason="IMAGE_TOO_LARGE",
        metadata={**metadata, "max_pixels": str(max_pixels)},
    )


def _unreadable(data: bytes, where: str, metadata: dict[str, str], error: Exception) -> InvalidArgument:
    """UNSUPPORTED_IMAGE_FORMAT when Pillow knows the bytes as another format (GIF, BMP, TIFF, ...), else
    INVALID_IMAGE."""
    other = _other_format(data)
    if other is not None:
        return InvalidArgument(
            f"{where}: {other} images are not supported; send {SUPPORTED}",
            reason="UNSUPPORTED_IMAGE_FORMAT",
            metadata={**metadata, "format": other},
        )
    # Pillow's own message names the file object it read, heap address and all: not the caller's business.
    detail = "no image header" if isinstance(error, UnidentifiedImageError) else str(error)
    return InvalidArgument(
        f"{where}: not a {SUPPORTED} image ({len(data)} bytes that do not decode: {detail})",
        reason="INVALID_IMAGE",
        metadata=metadata,
    )


def _other_format(data: bytes) -> str | None:
    """The format Pillow recognises in the header, for the message only (nothing is decoded)."""
    try:
        with Image.open(io.BytesIO(data)) as other:
            return other.format
    except Exception:  # noqa: BLE001 - not an image Pillow knows either
        return None
