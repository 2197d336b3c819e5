"""Checks an upload is a complete image of an allowed format and size before anything is stored."""

from __future__ import annotations

import hashlib
import warnings
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

from p2p.shared.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from p2p.shared.storage import HashedBytes

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


# Uploads up to this size are hashed from one in-memory copy that the object store then sends as it
# is (no second read, no second hash); larger ones are hashed in chunks and read again by the store.
IN_MEMORY_BYTES = 16 * CHUNK


def digest_upload(stream: BinaryIO, *, max_bytes: int) -> tuple[Digest, BinaryIO]:
    """sha256 and size of an upload, and the stream to read it from afterwards: a
    :class:`~p2p.shared.storage.HashedBytes` over its bytes when it fits in ``IN_MEMORY_BYTES``
    (the store sends those bytes without hashing them again), else ``stream`` itself, rewound."""
    stream.seek(0)
    head = stream.read(min(max_bytes, IN_MEMORY_BYTES) + 1)
    if len(head) <= IN_MEMORY_BYTES:
        if len(head) > max_bytes:
            raise PayloadTooLarge(f"image is larger than the {max_bytes}-byte limit")
        body = HashedBytes(head)
        return Digest(sha256=body.sha256, size=len(head)), body
    digest = hashlib.sha256()
    size = 0
    chunk = head
    while chunk:
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"image is larger than the {max_bytes}-byte limit")
        digest.update(chunk)
        chunk = stream.read(CHUNK)
    stream.seek(0)
    return Digest(sha256=digest.hexdigest(), size=size), stream


class _KeepOpen:
    """Lends a stream to Pillow, which closes what it reads from; the caller still needs it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)

    def close(self) -> None:
        pass


TRANSPARENT_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})


def flatten_on_white(image: Image.Image) -> Image.Image:
    """The image in RGB as it shows on a white page: transparent parts become white.

    Figures are made to be read on white paper, and exporters store a transparent pixel's colour
    as black, so dropping the alpha channel (``convert("RGB")``) would turn a transparent
    background black. Every decode that feeds the miner goes through here.
    """
    if image.mode in TRANSPARENT_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        page = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(page, rgba).convert("RGB")
    return image.convert("RGB")


def _corrupt(message: str) -> InvalidInput:
    return InvalidInput(f"image data is truncated or corrupt: {message}", error_type="corrupt_image")


# Start-of-frame markers (baseline, extended, progressive, lossless...); C4/C8/CC are not frames.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def check_jpeg_structure(stream: BinaryIO) -> None:
    """Walk the JPEG's marker segments and entropy-coded scans up to the end-of-image marker.

    This finds truncation and broken segment structure at a fraction of a full decode's cost
    (Huffman decoding dominates ingest time for 1 MB photographs). Damage inside entropy-coded
    data that keeps the structure intact surfaces later, when the mining worker decodes the image.
    """
    stream.seek(0)
    data = stream.read()
    if data[:2] != b"\xff\xd8":
        raise _corrupt("missing JPEG start-of-image marker")
    n, pos = len(data), 2
    seen_frame = seen_scan = False
    while pos < n:
        if data[pos] != 0xFF:
            raise _corrupt(f"expected a marker at byte {pos}")
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            break
        marker = data[pos]
        pos += 1
        if marker == 0xD9:
            if not (seen_frame and seen_scan):
                raise _corrupt("end of image before any frame or scan")
            return
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue
        if pos + 2 > n:
            raise _corrupt("segment header cut off")
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 2 or pos + length > n:
            raise _corrupt(f"segment 0x{marker:02X} runs past the end of the file")
        seen_frame |= marker in _SOF_MARKERS
        pos += length
        if marker == 0xDA:
            seen_scan = True
            # Entropy-coded data: 0xFF is followed by a stuffed 0x00, a restart marker, or ends the scan.
            while True:
                j = data.find(b"\xff", pos)
                if j < 0 or j + 1 >= n:
                    raise _corrupt("scan data cut off before the end-of-image marker")
                following = data[j + 1]
                if following == 0x00 or 0xD0 <= following <= 0xD7:
                    pos = j + 2
                elif following == 0xFF:
                    pos = j + 1
                else:
                    pos = j
                    break
    raise _corrupt("no end-of-image marker")


def check_png_chunks(stream: BinaryIO) -> None:
    """Every chunk complete with a matching CRC-32, image data present, and the closing IEND."""
    stream.seek(8)  # signature, already checked by Pillow's identification
    seen_data = False
    while True:
        header = stream.read(8)
        if len(header) < 8:
            raise _corrupt("PNG ends without its IEND chunk")
        length = int.from_bytes(header[:4], "big")
        kind = header[4:]
        if length > 0x7FFFFFFF:
            raise _corrupt("PNG chunk length out of range")
        body = stream.read(length)
        crc = stream.read(4)
        if len(body) < length or len(crc) < 4:
            raise _corrupt(f"PNG chunk {kind!r} cut off")
        if zlib.crc32(body, zlib.crc32(kind)) != int.from_bytes(crc, "big"):
            raise _corrupt(f"PNG chunk {kind!r} fails its CRC check")
        seen_data |= kind == b"IDAT"
        if kind == b"IEND":
            if not seen_data:
                raise _corrupt("PNG has no image data")
            return


def inspect_image(stream: BinaryIO, *, allowed_formats: tuple[str, ...], max_pixels: int) -> ImageInfo:
    """Identify the format, bound the size from the header, and check the data is complete.

    JPEG and PNG (nearly all figures) are checked structurally; other formats are decoded.
    """
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
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise _corrupt(f"unreadable header: {exc}") from exc
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
            check_jpeg_structure(stream)
        elif fmt == "PNG":
            check_png_chunks(stream)
        else:
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
