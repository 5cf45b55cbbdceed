"""Images for `Item.images`, sent as encoded bytes: bytes as they are, files as read from disk,
PIL images and numpy arrays encoded as PNG (lossless, so the server sees exactly these pixels). Pillow is needed only
for those two (the client's `images` extra); bytes and files go without it."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Union, cast

import numpy as np

from sie.v1 import types_pb2
from sie_client.extras import missing_extra

if TYPE_CHECKING:
    from PIL import Image

# Union, not `|`: pillow is optional, so "Image.Image" is a forward reference, which `|` cannot join at run time.
ImageLike = Union[bytes, str, os.PathLike, "Image.Image", np.ndarray]

# A file's suffix -> the format hint sent with its bytes (the server decides from the bytes either way).
_FORMAT_BY_SUFFIX = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".webp": "webp"}
# Modes PNG stores as they are; others (CMYK, YCbCr, float) are sent as RGB.
_PNG_MODES = ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA")


def image_message(image: ImageLike | Mapping[str, Any]) -> types_pb2.Image:
    """One image as the contract's `Image`: encoded bytes plus a format hint. An ImageInput dict ({"data", "format"},
    the reference's) is its `data` with its `format` as the hint."""
    if isinstance(image, Mapping):
        unknown = sorted(set(image) - {"data", "format"})
        if "data" not in image or unknown:
            raise TypeError(f"an image dict has the keys data and format, not {sorted(image)}")
        message = image_message(image["data"])
        if image.get("format"):
            message.format = str(image["format"]).lower()
        return message
    if isinstance(image, (bytes, bytearray, memoryview)):
        return types_pb2.Image(data=bytes(image))
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        return types_pb2.Image(data=path.read_bytes(), format=_FORMAT_BY_SUFFIX.get(path.suffix.lower(), ""))
    if isinstance(image, np.ndarray):
        image = _from_array(image)
    pil = _pil_image()
    if pil is not None and isinstance(image, pil.Image):
        picture = cast("Image.Image", image)  # the isinstance above, on the lazily imported class, does not narrow
        if picture.mode not in _PNG_MODES:
            picture = picture.convert("RGB")
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        return types_pb2.Image(data=buffer.getvalue(), format="png")
    raise TypeError(
        f"an image is encoded bytes, a file path, a PIL.Image, a numpy array or a {{data, format}} dict, not "
        f"{type(image).__name__}"
    )


def _from_array(array: np.ndarray) -> Image.Image:
    """A uint8 array: height x width (grey), or height x width x 3 (RGB) or 4 (RGBA)."""
    if array.dtype != np.uint8 or not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4))):
        raise TypeError(
            f"a numpy image must be uint8 with shape (height, width) or (height, width, 3 or 4), "
            f"got {array.dtype} {array.shape}; scale floats with (array * 255).astype('uint8')"
        )
    pil = _pil_image()
    if pil is None:
        raise missing_extra("a numpy image (sent as PNG)", "images", "PIL")
    return pil.fromarray(array)


def _pil_image() -> ModuleType | None:
    """PIL.Image when pillow is installed; without it there is no PIL image to send either."""
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image
