"""Checks an upload is a complete image of an allowed format and size before anything is stored."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

from p2p.shared.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType

CHUNK = 1024 * 1024

EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "TIFF": "tif", "GIF": "gif", "BMP": "bmp", "WEBP": "webp"}
CONTENT_TYPES = {
    "JPEG": "image/jpeg",
    "PNG": "image/png",
    "TIFF": "image/tiff",
    "GIF": "image/gif",
    "BMP": "image/bmp",
    "WEBP": "image/webp",
}

# Our own pixel cap is checked from the header; Pillow's bomb guard stays on behind it.
Image.MAX_IMAGE_PIXELS = max(Image.MAX_IMAGE_PIXELS or 0, 200_000_000)


@dataclass(frozen=True)
class Digest:
    sha256: str
    size: int


@dataclass(frozen=True)
class ImageInfo:
    format: str
    width: int
    height: int

    @property
    def extension(self) -> str:
        return EXTENSIONS.get(self.format, self.format.lower())

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES.get(self.format, "application/octet-stream")


def digest_stream(stream: BinaryIO, *, max_bytes: int) -> Digest:
    """sha256 and size of a seekable stream, refusing it as soon as it passes ``max_bytes``."""
    stream.seek(0)
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"image is larger than the {max_bytes}-byte limit")
        digest.update(chunk)
    stream.seek(0)
    return Digest(sha256=digest.hexdigest(), size=size)


class _KeepOpen:
    """Lends a stream to Pillow, which closes what it reads from; the caller still needs it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)

    def close(self) -> None:
        pass


def inspect_image(stream: BinaryIO, *, allowed_formats: tuple[str, ...], max_pixels: int) -> ImageInfo:
    """Identify, bound and fully decode the image (decoding is the only way to find truncation)."""
    stream.seek(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(_KeepOpen(stream))  # type: ignore[arg-type]
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidInput(str(exc), error_type="image_too_many_pixels") from exc
    except UnidentifiedImageError as exc:
        raise InvalidInput(
            "the upload is not an image Pillow can identify", error_type="not_an_image"
        ) from exc
    try:
        fmt = (image.format or "").upper()
        if fmt not in allowed_formats:
            raise UnsupportedMediaType(
                f"image format {fmt or 'unknown'} is not accepted; allowed: {', '.join(allowed_formats)}"
            )
        width, height = image.size
        if width <= 0 or height <= 0:
            raise InvalidInput("image has no pixels", error_type="corrupt_image")
        if width * height > max_pixels:
            raise InvalidInput(
                f"image has {width}x{height} = {width * height} pixels, over the {max_pixels}-pixel limit",
                error_type="image_too_many_pixels",
            )
        if fmt == "JPEG":
            # DCT scaling decodes every byte of the stream at 1/8 size: truncation still surfaces.
            image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
        try:
            image.load()
        except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
            raise InvalidInput(
                f"image data is truncated or corrupt: {exc}", error_type="corrupt_image"
            ) from exc
        return ImageInfo(format=fmt, width=width, height=height)
    finally:
        image.close()
        stream.seek(0)
