"""Decoding the images of request items, within the limits that keep a worker safe from them.

JPEG, PNG and WebP are accepted; the bytes decide the format. An item's
`format`, when set, must name one of them (`jpeg`/`jpg`, `png`, `webp`, or
their `image/...` MIME types); a supported hint that disagrees with the bytes
is ignored. The file's size is checked against SIE_MAX_IMAGE_BYTES, then
the header's width and height against SIE_MAX_IMAGE_PIXELS and
SIE_MAX_IMAGE_ASPECT_RATIO, the size the model's processor would resize
the image to against SIE_MAX_IMAGE_PIXELS, and a JPEG's scans against
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

from PIL import Image, ImageOps, UnidentifiedImageError

from sie_common.edge.errors import InvalidArgument
from sie_common.edge.request_bounds import check_image_bytes
from sie_worker.engine.jobs import ImageInput, ItemInput
from sie_worker.engine.limits import Limits, check_image_size, check_jpeg_scans, check_request_pixels

# Pillow's format name -> the names a `format` hint may use for it.
FORMATS = {"JPEG": ("jpeg", "jpg"), "PNG": ("png",), "WEBP": ("webp",)}
_HINTS = {hint: name for name, hints in FORMATS.items() for hint in hints}
SUPPORTED = "JPEG, PNG or WebP"

# SIE_MAX_IMAGE_PIXELS is the limit here; Pillow's warning for large headers would only repeat it in the log.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)


def decode_image(
    item: ItemInput, position: int, *, limits: Limits, resized_pixels: Callable[[int, int], int]
) -> Image.Image:
    """The decoded image `position` of `item`, in its own mode (the model's processor converts it), turned as its
    EXIF orientation says.

    `resized_pixels(width, height)`: the pixels the model's processor resizes an image of that size to."""
    image = item.images[position]
    where = f"{item.label}: images[{position}]"
    metadata = {**item.metadata, "image": str(position)}
    _check_hint(image, where, metadata)
    check_image_bytes(len(image.data), where, metadata, limits)
    try:
        opened = Image.open(io.BytesIO(image.data), formats=tuple(FORMATS))
    except Image.DecompressionBombError:  # Pillow's own guard: the header claims over twice Image.MAX_IMAGE_PIXELS
        raise _too_large(
            where, metadata, limits.image_pixels, f"more than {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels"
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise _unreadable(image.data, where, metadata, error) from None
    width, height = opened.size
    check_image_size(width, height, resized_pixels(width, height), where, metadata, limits)
    if opened.format == "JPEG":
        check_jpeg_scans(image.data, where, metadata, limits)
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


def check_images_pixels(
    items: Sequence[ItemInput], *, limits: Limits, resized_pixels: Callable[[int, int], int]
) -> None:
    """The first image of each item, counted from its header (decoded plus resized pixels) against
    SIE_MAX_REQUEST_IMAGE_PIXELS. An image whose header does not read, or that is over a bound of its own (size,
    aspect ratio), counts nothing here: decode_image refuses it, naming its item."""
    total = images = 0
    for item in items:
        if not item.images:
            continue
        try:
            with Image.open(io.BytesIO(item.images[0].data), formats=tuple(FORMATS)) as opened:
                width, height = opened.size
        except Exception:  # noqa: BLE001 - decode_image says what is wrong with it
            continue
        resized = resized_pixels(width, height)
        try:
            check_image_size(width, height, resized, item.label, item.metadata, limits)
        except InvalidArgument:
            continue
        total += width * height + resized
        images += 1
    check_request_pixels(total, images, limits)


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
