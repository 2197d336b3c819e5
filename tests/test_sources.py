from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from PIL import Image

from p2p.ingest.sources.base import ItemError, SourceError, SourceItem
from p2p.ingest.sources.files import FileTooLarge, LocalFiles, S3Files, UnsafePath
from p2p.ingest.sources.manifest import iter_manifest
from p2p.ingest.sources.pmc import iter_pmc_package
from p2p.ingest.sources.webdataset import iter_webdataset
from p2p.shared.storage import S3ObjectStore

MB = 1024 * 1024


# --------------------------------------------------------------------------- helpers


def png_bytes(color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (8, 6)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def jpeg_bytes(color: tuple[int, int, int] = (30, 30, 200), size: tuple[int, int] = (10, 7)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="JPEG")
    return out.getvalue()


def noise_png(size: tuple[int, int] = (64, 64)) -> bytes:
    """A PNG that does not compress away (so its byte size is well above a few hundred bytes)."""
    out = io.BytesIO()
    Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3)).save(out, format="PNG")
    return out.getvalue()


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def special_member(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
    return info, None


def make_tar(members: Iterable[tuple[tarfile.TarInfo, bytes | None]], *, gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def simple_tar(files: dict[str, bytes], *, gz: bool = False) -> bytes:
    return make_tar((file_member(n, d) for n, d in files.items()), gz=gz)


class NonSeekable(io.RawIOBase):
    """A forward-only stream: proves a reader never seeks."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: Any) -> int:
        chunk = self._inner.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def seek(self, offset: int, whence: int = 0) -> int:
        raise OSError("not seekable")

    def tell(self) -> int:
        raise OSError("not seekable")


def items_of(results: Iterable[SourceItem | ItemError]) -> list[SourceItem]:
    return [r for r in results if isinstance(r, SourceItem)]


def errors_of(results: Iterable[SourceItem | ItemError]) -> list[ItemError]:
    return [r for r in results if isinstance(r, ItemError)]


def write_lines(path: Path, records: list[Any]) -> None:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- LocalFiles


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "a.png").write_bytes(b"A" * 10)
    (root / "sub" / "b.jpg").write_bytes(b"B" * 20)
    (root / "sub" / "deep" / "c.PNG").write_bytes(b"C" * 30)
    (root / "notes.txt").write_text("hello")
    return root


def test_local_files_lists_reads_and_copies(tree: Path) -> None:
    files = LocalFiles(tree)
    assert str(tree.resolve()) in files.describe
    assert files.list((".png", ".jpg")) == ["a.png", "sub/b.jpg", "sub/deep/c.PNG"]
    assert files.list(()) == ["a.png", "notes.txt", "sub/b.jpg", "sub/deep/c.PNG"]
    assert files.exists("sub/b.jpg")
    assert not files.exists("sub/missing.jpg")
    assert not files.exists("sub")  # a folder is not a file
    assert files.size("sub/deep/c.PNG") == 30
    with files.open("a.png") as fh:
        assert fh.read() == b"A" * 10
    assert files.read_bytes("sub/b.jpg", 20) == b"B" * 20
    with pytest.raises(FileTooLarge) as too_large:
        files.read_bytes("sub/b.jpg", 19)
    assert too_large.value.size == 20 and too_large.value.max_bytes == 19
    out = io.BytesIO()
    files.download("sub/deep/c.PNG", out)
    assert out.getvalue() == b"C" * 30


def test_local_files_missing_names_raise_file_not_found(tree: Path) -> None:
    files = LocalFiles(tree)
    with pytest.raises(FileNotFoundError):
        files.size("nope.png")
    with pytest.raises(FileNotFoundError):
        files.open("nope.png")
    with pytest.raises(FileNotFoundError):
        files.read_bytes("nope.png", 100)
    with pytest.raises(FileNotFoundError):
        files.download("nope.png", io.BytesIO())
    with pytest.raises(FileNotFoundError):
        files.read_bytes("sub", 100)


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../outside.png", "sub/../../outside.png", "", "..", "\\x.png"]
)
def test_local_files_refuse_unsafe_names(tree: Path, name: str) -> None:
    files = LocalFiles(tree)
    with pytest.raises(UnsafePath):
        files.read_bytes(name, 100)
    with pytest.raises(UnsafePath):
        files.exists(name)
    with pytest.raises(UnsafePath):
        files.open(name)


def test_local_files_refuse_symlinks_leading_outside(tree: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"secret")
    (tree / "escape.png").symlink_to(secret)
    (tree / "escape_dir").symlink_to(tmp_path)
    (tree / "inside.png").symlink_to(tree / "a.png")
    files = LocalFiles(tree)
    with pytest.raises(UnsafePath):
        files.read_bytes("escape.png", 100)
    with pytest.raises(UnsafePath):
        files.read_bytes("escape_dir/secret.png", 100)
    assert files.read_bytes("inside.png", 100) == b"A" * 10  # a link that stays inside is fine
    listed = files.list((".png",))
    assert "escape.png" not in listed
    assert "inside.png" in listed
    assert not any(name.startswith("escape_dir") for name in listed)


# --------------------------------------------------------------------------- manifest


def test_manifest_happy_path_with_nested_folders(tmp_path: Path) -> None:
    root = tmp_path / "batch"
    (root / "images").mkdir(parents=True)
    (root / "nested" / "deep").mkdir(parents=True)
    first, second = png_bytes(), jpeg_bytes()
    (root / "images" / "a.png").write_bytes(first)
    (root / "nested" / "deep" / "b.jpg").write_bytes(second)
    write_lines(
        root / "manifest.jsonl",
        [
            {"image": "images/a.png", "caption": "  First figure.  "},
            "",
            "   ",
            {
                "image": "nested/deep/b.jpg",
                "caption": "Second figure. (A) left (B) right.",
                "figure_label": "Figure 2",
                "inline_references": ["As Fig. 2 shows, it works."],
                "source_ref": "lab-archive/42",
                "article": {"pmcid": "PMC123", "doi": "10.1000/xyz", "year": 2021, "license": "CC BY 4.0"},
            },
        ],
    )

    results = list(iter_manifest(LocalFiles(root), max_image_bytes=MB))

    assert errors_of(results) == []
    first_item, second_item = items_of(results)
    assert first_item.key == "manifest.jsonl:1:images/a.png"
    assert first_item.image == first
    assert first_item.image_name == "a.png"
    assert first_item.caption == "First figure."
    assert first_item.metadata.article is None and first_item.metadata.inline_references == []

    assert second_item.key == "manifest.jsonl:4:nested/deep/b.jpg"  # blank lines count as lines
    assert second_item.image == second
    assert second_item.image_name == "b.jpg"
    assert second_item.metadata.figure_label == "Figure 2"
    assert second_item.metadata.inline_references == ["As Fig. 2 shows, it works."]
    assert second_item.metadata.source_ref == "lab-archive/42"
    article = second_item.metadata.article
    assert article is not None
    assert (article.pmcid, article.doi, article.year, article.license) == (
        "PMC123",
        "10.1000/xyz",
        2021,
        "CC BY 4.0",
    )


def test_manifest_in_a_subfolder_resolves_images_next_to_it(tmp_path: Path) -> None:
    (tmp_path / "b1" / "img").mkdir(parents=True)
    data = png_bytes((1, 2, 3))
    (tmp_path / "b1" / "img" / "x.png").write_bytes(data)
    # a UTF-8 byte order mark on the first line is tolerated
    (tmp_path / "b1" / "figs.jsonl").write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"image": "img/x.png", "caption": "cap \u00e9"}).encode() + b"\n"
    )
    [item] = list(iter_manifest(LocalFiles(tmp_path), "b1/figs.jsonl", max_image_bytes=MB))
    assert isinstance(item, SourceItem)
    assert item.key == "b1/figs.jsonl:1:img/x.png"
    assert item.image == data
    assert item.caption == "cap \u00e9"


def test_manifest_reports_every_bad_line_and_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    (root / "ok.png").write_bytes(png_bytes())
    (root / "big.png").write_bytes(noise_png())
    (tmp_path / "outside.png").write_bytes(png_bytes())
    (root / "link.png").symlink_to(tmp_path / "outside.png")
    write_lines(
        root / "manifest.jsonl",
        [
            '{"image": "ok.png", "caption": ',  # 1
            {"image": "ok.png", "caption": "c", "title": "x", "zeta": 1},  # 2
            {"caption": "no image"},  # 3
            {"image": "ok.png", "caption": 5},  # 4
            {"image": "ok.png"},  # 5
            {"image": "../outside.png", "caption": "c"},  # 6
            {"image": "/etc/passwd", "caption": "c"},  # 7
            {"image": "absent.png", "caption": "c"},  # 8
            {"image": "big.png", "caption": "c"},  # 9
            {"image": "ok.png", "caption": "c", "article": {"pmcid": "123abc", "year": 99}},  # 10
            {"image": "ok.png", "caption": "c", "article": {"color": "red"}},  # 11
            {"image": "link.png", "caption": "c"},  # 12
            [1, 2],  # 13
            {"image": "ok.png", "caption": "   "},  # 14
            {"image": "ok.png", "caption": "still works"},  # 15
        ],
    )

    results = list(iter_manifest(LocalFiles(root), max_image_bytes=1000))

    assert len(results) == 15
    assert [(r.key, r.error_type) for r in results if isinstance(r, ItemError)] == [
        ("manifest.jsonl:1:", "invalid_json"),
        ("manifest.jsonl:2:ok.png", "unknown_field"),
        ("manifest.jsonl:3:", "invalid_item"),
        ("manifest.jsonl:4:ok.png", "invalid_item"),
        ("manifest.jsonl:5:ok.png", "invalid_item"),
        ("manifest.jsonl:6:../outside.png", "path_traversal"),
        ("manifest.jsonl:7:/etc/passwd", "path_traversal"),
        ("manifest.jsonl:8:absent.png", "missing_image"),
        ("manifest.jsonl:9:big.png", "image_too_large"),
        ("manifest.jsonl:10:ok.png", "invalid_metadata"),
        ("manifest.jsonl:11:ok.png", "unknown_field"),
        ("manifest.jsonl:12:link.png", "path_traversal"),
        ("manifest.jsonl:13:", "invalid_item"),
        ("manifest.jsonl:14:ok.png", "missing_caption"),
    ]
    messages = {r.key.split(":")[1]: r.message for r in errors_of(results)}
    assert "title" in messages["2"] and "zeta" in messages["2"]
    assert "caption" in messages["4"] and "caption" in messages["5"]
    assert "article.pmcid" in messages["10"] and "article.year" in messages["10"]
    assert "article.color" in messages["11"]
    [last] = items_of(results)
    assert last.key == "manifest.jsonl:15:ok.png" and last.caption == "still works"


def test_manifest_not_found_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as err:
        list(iter_manifest(LocalFiles(tmp_path), max_image_bytes=MB))
    assert err.value.error_type == "manifest_not_found"
    with pytest.raises(SourceError) as err:
        list(iter_manifest(LocalFiles(tmp_path), "../manifest.jsonl", max_image_bytes=MB))
    assert err.value.error_type == "path_traversal"


# --------------------------------------------------------------------------- S3Files


def put(store: S3ObjectStore, key: str, data: bytes) -> None:
    store.client.put_object(store.bucket, key, io.BytesIO(data), length=len(data))


def test_s3_files_and_manifest_on_a_real_s3_server(s3_store: S3ObjectStore) -> None:
    a, b, big = png_bytes(), jpeg_bytes(), noise_png()
    prefix = "batches/b1"
    put(s3_store, f"{prefix}/images/a.png", a)
    put(s3_store, f"{prefix}/images/nested/b.jpg", b)
    put(s3_store, f"{prefix}/big.png", big)
    put(s3_store, "batches/other/x.png", a)  # outside the prefix
    put(s3_store, "batches/b1x/y.png", a)  # shares the prefix string, not the folder
    manifest = [
        {"image": "images/a.png", "caption": "A", "article": {"pmid": "77"}},
        {"image": "images/nested/b.jpg", "caption": "B", "figure_label": "Fig. 3"},
        {"image": "images/missing.png", "caption": "C"},
        {"image": "big.png", "caption": "D"},
        {"image": "../other/x.png", "caption": "E"},
    ]
    put(s3_store, f"{prefix}/manifest.jsonl", ("\n".join(json.dumps(m) for m in manifest) + "\n").encode())

    files = S3Files(s3_store.client, s3_store.bucket, prefix)
    assert s3_store.bucket in files.describe
    assert files.list((".png", ".jpg")) == ["big.png", "images/a.png", "images/nested/b.jpg"]
    assert files.list(()) == ["big.png", "images/a.png", "images/nested/b.jpg", "manifest.jsonl"]
    assert files.exists("images/a.png") and not files.exists("images/zzz.png")
    assert files.size("big.png") == len(big)
    assert files.read_bytes("images/nested/b.jpg", MB) == b
    with pytest.raises(FileTooLarge):
        files.read_bytes("big.png", 100)
    with files.open("images/a.png") as fh:
        assert fh.read() == a
    out = io.BytesIO()
    files.download("big.png", out)
    assert out.getvalue() == big
    for call in (
        lambda: files.size("nope"),
        lambda: files.open("nope"),
        lambda: files.read_bytes("nope", 10),
    ):
        with pytest.raises(FileNotFoundError):
            call()
    with pytest.raises(FileNotFoundError):
        files.download("nope", io.BytesIO())
    with pytest.raises(UnsafePath):
        files.read_bytes("../other/x.png", MB)

    results = list(iter_manifest(files, max_image_bytes=len(big) - 1))

    first, second = items_of(results)
    assert (first.key, first.image, first.caption) == ("manifest.jsonl:1:images/a.png", a, "A")
    assert first.metadata.article is not None and first.metadata.article.pmid == "77"
    assert (second.image, second.image_name, second.metadata.figure_label) == (b, "b.jpg", "Fig. 3")
    assert [(e.key, e.error_type) for e in errors_of(results)] == [
        ("manifest.jsonl:3:images/missing.png", "missing_image"),
        ("manifest.jsonl:4:big.png", "image_too_large"),
        ("manifest.jsonl:5:../other/x.png", "path_traversal"),
    ]

    with pytest.raises(SourceError) as err:
        list(iter_manifest(S3Files(s3_store.client, s3_store.bucket, "batches/none"), max_image_bytes=MB))
    assert err.value.error_type == "manifest_not_found"
    whole_bucket = S3Files(s3_store.client, s3_store.bucket, "")
    assert whole_bucket.read_bytes("batches/other/x.png", MB) == a


# --------------------------------------------------------------------------- WebDataset


def test_webdataset_txt_json_and_biomedica_captions(tmp_path: Path) -> None:
    img1, img2, img3, img4 = jpeg_bytes(), png_bytes(), jpeg_bytes((0, 255, 0)), png_bytes((9, 9, 9))
    shard0 = make_tar(
        [
            special_member("sub", tarfile.DIRTYPE),
            file_member("0001.jpg", img1),
            file_member("0001.txt", "Caption one \u00b5m.\n".encode()),
            file_member(
                "0002.json", json.dumps({"caption": "Caption two", "figure_label": "Fig. 2"}).encode()
            ),
            file_member("0002.png", img2),
            special_member("0099.jpg", tarfile.SYMTYPE, "0001.jpg"),
            file_member("sub/0003.jpg", img3),
            file_member("sub/0003.txt", b"text caption loses"),
            file_member(
                "sub/0003.json",
                json.dumps({"caption": "json caption wins", "article": {"doi": "10.5555/abc"}}).encode(),
            ),
            file_member(".hidden", b"x"),
            file_member("README", b"no extension"),
        ]
    )
    biomedica = {
        "caption": "Histology of the liver.",
        "pmcid": "4567",
        "PMID": 7654321,
        "doi": "not-a-doi",  # dropped, the sample is kept
        "title": "Liver paper",
        "journal": "Hepatology Tests",
        "year": "2019",
        "license": "https://creativecommons.org/licenses/by-nc/4.0/",
        "image_primary_label": "microscopy",
        "image_panel_type": "single",
        "accession_id": "PMC4567",
    }
    shard1 = make_tar(
        [file_member("a/b/fig-1.png", img4), file_member("a/b/fig-1.json", json.dumps(biomedica).encode())],
        gz=True,
    )
    shards: list[tuple[str, BinaryIO]] = [
        ("shard-000.tar", io.BufferedReader(NonSeekable(shard0))),
        ("shard-001.tar.gz", io.BufferedReader(NonSeekable(shard1))),
    ]

    results = list(iter_webdataset(shards, max_image_bytes=MB))

    assert errors_of(results) == []
    one, two, three, four = items_of(results)
    assert (one.key, one.image, one.image_name, one.caption) == (
        "shard-000.tar/0001",
        img1,
        "0001.jpg",
        "Caption one \u00b5m.",
    )
    assert (two.key, two.image, two.caption) == ("shard-000.tar/0002", img2, "Caption two")
    assert two.metadata.figure_label == "Fig. 2"
    assert (three.key, three.image, three.caption) == ("shard-000.tar/sub/0003", img3, "json caption wins")
    assert three.metadata.article is not None and three.metadata.article.doi == "10.5555/abc"
    assert (four.key, four.image, four.image_name) == ("shard-001.tar.gz/a/b/fig-1", img4, "fig-1.png")
    assert four.caption == "Histology of the liver."
    article = four.metadata.article
    assert article is not None
    assert article.model_dump(exclude_none=True) == {
        "pmcid": "PMC4567",
        "pmid": "7654321",
        "title": "Liver paper",
        "journal": "Hepatology Tests",
        "year": 2019,
        "license": "CC BY-NC 4.0",
    }


def test_webdataset_reports_bad_samples_and_goes_on() -> None:
    big = noise_png()
    shard = make_tar(
        [
            file_member("s1.txt", b"caption without image"),
            file_member("s2.jpg", jpeg_bytes()),
            file_member("s3.png", big),
            file_member("s3.txt", b"too big"),
            file_member("s4.jpg", jpeg_bytes()),
            file_member("s4.json", b'{"caption": "broken'),
            file_member("s5.jpg", jpeg_bytes()),
            file_member("s5.json", json.dumps({"caption": 12}).encode()),
            file_member("s6.jpg", jpeg_bytes()),
            file_member("s6.json", b"[1, 2]"),
            file_member("s7.jpg", jpeg_bytes()),
            file_member("s7.txt", b"\xff\xfe not utf-8"),
            file_member("s8.jpg", jpeg_bytes()),
            file_member(
                "s8.json", json.dumps({"caption": "c", "figure_label": ["not", "a", "string"]}).encode()
            ),
            file_member("s9.jpg", jpeg_bytes()),
            file_member("s9.txt", b"fine"),
        ]
    )

    results = list(iter_webdataset([("bad.tar", io.BytesIO(shard))], max_image_bytes=len(big) - 1))

    assert [(r.key, r.error_type) for r in errors_of(results)] == [
        ("bad.tar/s1", "missing_image"),
        ("bad.tar/s2", "missing_caption"),
        ("bad.tar/s3", "image_too_large"),
        ("bad.tar/s4", "invalid_json"),
        ("bad.tar/s5", "missing_caption"),
        ("bad.tar/s6", "invalid_json"),
        ("bad.tar/s7", "invalid_caption"),
        ("bad.tar/s8", "invalid_metadata"),
    ]
    assert "figure_label" in errors_of(results)[-1].message
    [fine] = items_of(results)
    assert (fine.key, fine.caption) == ("bad.tar/s9", "fine")


def test_webdataset_not_a_tar_names_the_shard_after_earlier_items() -> None:
    good = simple_tar({"x.png": png_bytes(), "x.txt": b"ok"})
    shards: list[tuple[str, BinaryIO]] = [
        ("good.tar", io.BytesIO(good)),
        ("broken.tar", io.BytesIO(b"this is plainly not a tar archive\n" * 40)),
    ]
    stream = iter_webdataset(shards, max_image_bytes=MB)
    first = next(stream)
    assert isinstance(first, SourceItem) and first.key == "good.tar/x"
    with pytest.raises(SourceError) as err:
        next(stream)
    assert err.value.error_type == "not_a_tar"
    assert "broken.tar" in err.value.message


@pytest.mark.parametrize(
    "data", [gzip.compress(b"gzip, but no tar inside" * 50), b"", b"\x00\x01\x02garbage"]
)
def test_webdataset_other_non_tars(data: bytes) -> None:
    with pytest.raises(SourceError) as err:
        list(iter_webdataset([("s.tar", io.BytesIO(data))], max_image_bytes=MB))
    assert err.value.error_type == "not_a_tar"


def test_webdataset_truncated_shard_is_reported_and_next_shard_read() -> None:
    payload = noise_png((40, 40))
    shard = simple_tar(
        {f"{i:04d}.{ext}": payload if ext == "png" else b"cap" for i in range(3) for ext in ("png", "txt")}
    )
    later = simple_tar({"z.png": png_bytes(), "z.txt": b"z"})
    cut_in_data = shard[: len(shard) // 2]
    results = list(
        iter_webdataset(
            [("cut.tar", io.BytesIO(cut_in_data)), ("later.tar", io.BytesIO(later))], max_image_bytes=MB
        )
    )
    errors = errors_of(results)
    assert [e.error_type for e in errors] == ["corrupt_shard"]
    assert errors[0].key.startswith("cut.tar")
    assert items_of(results)[-1].key == "later.tar/z"

    # cut inside a header: tarfile alone would end quietly, the reader says what happened
    first_two_members = 512 + ((len(payload) + 511) // 512) * 512 + 1024
    results = list(
        iter_webdataset([("cut.tar", io.BytesIO(shard[: first_two_members + 100]))], max_image_bytes=MB)
    )
    assert [type(r).__name__ for r in results] == ["SourceItem", "ItemError"]
    assert isinstance(results[1], ItemError) and results[1].error_type == "corrupt_shard"


# --------------------------------------------------------------------------- PMC packages

NXML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE article
  PUBLIC "-//NLM//DTD JATS (Z39.96) Journal Archiving and Interchange DTD v1.2 20190208//EN"
  "JATS-archivearticle1.dtd">
<article xmlns:xlink="http://www.w3.org/1999/xlink" xmlns:mml="http://www.w3.org/1998/Math/MathML"
  article-type="research-article">
<front>
  <journal-meta>
    <journal-id journal-id-type="nlm-ta">J Tests</journal-id>
    <journal-title-group><journal-title>Journal of   Tests</journal-title></journal-title-group>
  </journal-meta>
  <article-meta>
    <article-id pub-id-type="pmid">111</article-id>
    <article-id pub-id-type="pmc">4242</article-id>
    <article-id pub-id-type="doi">10.1234/jt.2020.1</article-id>
    <title-group><article-title>A study of <italic>E. coli</italic>
      growth</article-title></title-group>
    <pub-date pub-type="ppub"><year>2021</year></pub-date>
    <pub-date pub-type="epub"><day>3</day><month>5</month><year>2020</year></pub-date>
    <permissions>
      <copyright-statement>(c) 2020 The Authors</copyright-statement>
      <license xlink:href="https://creativecommons.org/licenses/by/4.0/">
        <license-p>This article is licensed under a Creative Commons Attribution 4.0 License.</license-p>
      </license>
    </permissions>
    <abstract><sec><title>Background</title><p>Cells grow.</p></sec>
      <sec><title>Results</title><p>They <bold>did</bold>.</p></sec></abstract>
    <abstract abstract-type="graphical"><p>Graphical abstract.</p></abstract>
  </article-meta>
</front>
<body>
  <sec><title>Results</title>
    <p>As shown in <xref ref-type="fig" rid="f1">Fig. 1</xref>, the <italic>E. coli</italic> cells grow.</p>
    <p><xref ref-type="fig" rid="f1 f2">Figs 1 and 2</xref> compare both strains.
      <fig id="f1" position="float">
      <label>Figure 1</label>
      <caption><title>Growth curves.</title><p>Cells of <italic>E. coli</italic> grown at 37&#x000b0;C;
        compare <xref ref-type="fig" rid="f2">Fig. 2</xref>.</p></caption>
      <graphic xlink:href="jt-2020-1-g001"/>
    </fig></p>
    <p>Only the second figure is cited here (<xref ref-type="fig" rid="fg1">Fig. 2</xref>).</p>
    <p>No figure here <xref ref-type="bibr" rid="b1">[1]</xref>.</p>
  </sec>
</body>
<floats-group>
  <fig-group id="fg1">
    <fig id="f2"><label>Figure 2</label>
      <caption><p>Second   <bold>figure</bold>
        caption.</p></caption>
      <graphic xlink:href="fig2.png"/>
    </fig>
  </fig-group>
</floats-group>
</article>
"""


def pmc_package(
    nxml: str | bytes = NXML,
    *,
    extra: Iterable[tuple[tarfile.TarInfo, bytes | None]] = (),
    images: dict[str, bytes] | None = None,
    nxml_name: str = "PMC4242/jt-2020-1.nxml",
    gz: bool = True,
) -> bytes:
    if images is None:
        images = {
            "PMC4242/jt-2020-1-g001.gif": b"GIF89a thumbnail",
            "PMC4242/jt-2020-1-g001.jpg": jpeg_bytes(),
            "PMC4242/fig2.png": png_bytes(),
        }
    data = nxml.encode() if isinstance(nxml, str) else nxml
    members = [special_member("PMC4242", tarfile.DIRTYPE), file_member(nxml_name, data)]
    members += [file_member(name, content) for name, content in images.items()]
    members.append(file_member("PMC4242/jt-2020-1.pdf", b"%PDF-1.4 not really"))
    members += list(extra)
    return make_tar(members, gz=gz)


def read_package(data: bytes, name: str = "jt.tar.gz", **limits: int) -> list[SourceItem | ItemError]:
    options = {"max_image_bytes": MB, "max_members": 100, "max_total_bytes": 10 * MB}
    options.update(limits)
    return list(iter_pmc_package(io.BytesIO(data), name, **options))


def test_pmc_package_happy_path() -> None:
    jpg, png = jpeg_bytes((5, 6, 7)), png_bytes((7, 6, 5))
    package = pmc_package(
        images={
            "PMC4242/jt-2020-1-g001.gif": b"GIF89a thumbnail",
            "PMC4242/jt-2020-1-g001.jpg": jpg,
            "PMC4242/jt-2020-1-g001.tif": b"II*\x00 a tiff",
            "PMC4242/fig2.png": png,
        }
    )

    results = read_package(package, "oa_package/jt.tar.gz")

    assert errors_of(results) == []
    first, second = items_of(results)

    assert first.key == "PMC4242/f1"
    assert first.image == jpg  # extension-less href: jpg preferred over gif and tif
    assert first.image_name == "jt-2020-1-g001.jpg"
    assert first.caption == "Growth curves. Cells of E. coli grown at 37\u00b0C; compare Fig. 2."
    assert first.metadata.figure_label == "Figure 1"
    assert first.metadata.source_ref == "oa_package/jt.tar.gz#f1"
    assert first.metadata.inline_references == [
        "As shown in Fig. 1, the E. coli cells grow.",
        "Figs 1 and 2 compare both strains.",  # the figure nested in the paragraph is not its text
    ]

    assert second.key == "PMC4242/f2"
    assert second.image == png and second.image_name == "fig2.png"
    assert second.caption == "Second figure caption."
    assert second.metadata.figure_label == "Figure 2"
    assert second.metadata.inline_references == [
        "Figs 1 and 2 compare both strains.",
        "Only the second figure is cited here (Fig. 2).",  # cited through its fig-group id
    ]

    article = first.metadata.article
    assert article is not None and article == second.metadata.article
    assert article.model_dump() == {
        "pmcid": "PMC4242",
        "pmid": "111",
        "doi": "10.1234/jt.2020.1",
        "title": "A study of E. coli growth",
        "abstract": "Background Cells grow. Results They did.",
        "journal": "Journal of Tests",
        "year": 2020,
        "license": "CC BY 4.0",
    }


def test_pmc_plain_tar_and_alternative_metadata_forms() -> None:
    nxml = """<?xml version="1.0"?>
<article xmlns:xlink="http://www.w3.org/1999/xlink" xmlns:ali="http://www.niso.org/schemas/ali/1.0/">
<front><journal-meta><journal-title>Old Style Journal</journal-title></journal-meta>
<article-meta>
  <article-id pub-id-type="doi">doi: weird value</article-id>
  <article-id pub-id-type="pmid">not-a-number</article-id>
  <title-group><article-title>Only a title</article-title></title-group>
  <pub-date date-type="pub" publication-format="print"><year>2018</year></pub-date>
  <pub-date pub-type="collection"><year>2017</year></pub-date>
  <permissions><license><ali:license_ref>http://creativecommons.org/licenses/by-nc-nd/4.0/</ali:license_ref>
    <license-p>Some words.</license-p></license></permissions>
</article-meta></front>
<body><p>See <xref ref-type="fig" rid="F1">Figure 1</xref>.</p></body>
<back><fig id="F1"><label>Fig. 1</label><caption><p>Only caption.</p></caption>
  <graphic xlink:href="images/Fig1.PNG"/></fig></back>
</article>"""
    image = png_bytes()
    package = pmc_package(nxml, images={"PMC4242/Fig1.PNG": image}, gz=False)

    [item] = read_package(package, "pkg.tar")

    assert isinstance(item, SourceItem)
    assert item.key == "pkg.tar/F1"  # no pmcid: the package name keys the figure
    assert item.image == image and item.image_name == "Fig1.PNG"
    assert item.metadata.inline_references == ["See Figure 1."]
    article = item.metadata.article
    assert article is not None
    # the weird doi and pmid are dropped, the rest is kept
    assert article.model_dump(exclude_none=True) == {
        "title": "Only a title",
        "journal": "Old Style Journal",
        "year": 2018,
        "license": "CC BY-NC-ND 4.0",
    }


def test_pmc_license_from_text_and_pmcid_form() -> None:
    nxml = NXML.replace(
        '<article-id pub-id-type="pmc">4242</article-id>',
        '<article-id pub-id-type="pmcid">PMC99</article-id>',
    )
    nxml = nxml.replace(' xlink:href="https://creativecommons.org/licenses/by/4.0/"', "")
    nxml = nxml.replace(
        "Creative Commons Attribution 4.0 License", "Creative Commons Attribution-NonCommercial License"
    )
    items = items_of(read_package(pmc_package(nxml)))
    assert [i.key for i in items] == ["PMC99/f1", "PMC99/f2"]
    article = items[0].metadata.article
    assert article is not None and article.pmcid == "PMC99" and article.license == "CC BY-NC"


def test_pmc_figure_level_errors_do_not_stop_the_package() -> None:
    big = noise_png()
    nxml = NXML.replace(
        "</floats-group>",
        """<fig id="f3"><label>Figure 3</label><caption><p>No graphic.</p></caption></fig>
<fig id="f4"><label>Figure 4</label><caption><p>Image absent.</p></caption>
  <graphic xlink:href="nowhere"/></fig>
<fig id="f5"><label>Figure 5</label><caption><p>Too large.</p></caption><graphic xlink:href="big"/></fig>
<fig id="f6"><label>Figure 6</label><graphic xlink:href="fig2.png"/></fig>
</floats-group>""",
    )
    package = pmc_package(
        nxml,
        images={
            "PMC4242/jt-2020-1-g001.jpg": jpeg_bytes(),
            "PMC4242/fig2.png": png_bytes(),
            "PMC4242/big.tif": big,
        },
    )
    results = read_package(package, max_image_bytes=len(big) - 1)
    assert [i.key for i in items_of(results)] == ["PMC4242/f1", "PMC4242/f2"]
    assert [(e.key, e.error_type) for e in errors_of(results)] == [
        ("PMC4242/f3", "missing_image"),
        ("PMC4242/f4", "missing_image"),
        ("PMC4242/f5", "image_too_large"),
        ("PMC4242/f6", "missing_caption"),
    ]


def test_pmc_picks_the_shallowest_nxml() -> None:
    decoy = NXML.replace("4242", "5555")
    package = pmc_package(extra=[file_member("PMC4242/supp/deeper/other.nxml", decoy.encode() + b" " * 5000)])
    assert [i.key for i in items_of(read_package(package))] == ["PMC4242/f1", "PMC4242/f2"]


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol9 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
]>
<article><front><article-meta><article-title>&lol9;</article-title></article-meta></front></article>
"""

XXE = """<?xml version="1.0"?>
<!DOCTYPE article [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<article><body><p>&secret;</p></body></article>
"""


def gz_of_tar_header_only() -> bytes:
    return gzip.compress(b"this is gzip but the payload is no tar archive at all\n" * 30)


@pytest.mark.parametrize(
    ("package", "error_type"),
    [
        (b"PK\x03\x04 a zip file perhaps" * 20, "not_a_tar"),
        (gz_of_tar_header_only(), "not_a_tar"),
        (b"", "not_a_tar"),
        (pmc_package(extra=[file_member("PMC4242/../../evil.sh", b"#!/bin/sh")]), "hostile_package"),
        (pmc_package(extra=[file_member("/etc/cron.d/evil", b"* * * * *")]), "hostile_package"),
        (
            pmc_package(extra=[special_member("PMC4242/link.jpg", tarfile.SYMTYPE, "/etc/passwd")]),
            "hostile_package",
        ),
        (
            pmc_package(extra=[special_member("PMC4242/hard.jpg", tarfile.LNKTYPE, "PMC4242/fig2.png")]),
            "hostile_package",
        ),
        (pmc_package(extra=[special_member("PMC4242/dev", tarfile.CHRTYPE)]), "hostile_package"),
        (pmc_package(extra=[special_member("PMC4242/fifo", tarfile.FIFOTYPE)]), "hostile_package"),
        (pmc_package(extra=[file_member(f"PMC4242/s{i}.txt", b"x") for i in range(120)]), "too_many_members"),
        (pmc_package(extra=[file_member("PMC4242/huge.bin", bytes(11 * MB))]), "package_too_large"),
        (pmc_package(nxml_name="PMC4242/article.xml"), "missing_nxml"),
        (pmc_package("this is not XML <at all"), "invalid_nxml"),
        (pmc_package("<article><unclosed></article>"), "invalid_nxml"),
        (pmc_package(BILLION_LAUGHS), "invalid_nxml"),
        (pmc_package(XXE), "invalid_nxml"),
    ],
    ids=[
        "zip",
        "gzip-not-tar",
        "empty",
        "dotdot",
        "absolute",
        "symlink",
        "hardlink",
        "chardev",
        "fifo",
        "too-many-members",
        "too-large",
        "no-nxml",
        "not-xml",
        "malformed-xml",
        "billion-laughs",
        "xxe",
    ],
)
def test_pmc_refuses_bad_packages_before_yielding(package: bytes, error_type: str) -> None:
    stream = iter_pmc_package(
        io.BytesIO(package), "bad.tar.gz", max_image_bytes=MB, max_members=100, max_total_bytes=10 * MB
    )
    with pytest.raises(SourceError) as err:
        next(stream)
    assert err.value.error_type == error_type
    assert "bad.tar.gz" in err.value.message


def test_pmc_hostile_member_late_in_the_archive_still_refuses_everything() -> None:
    # The valid article and images come first; the traversal member is the very last one.
    package = pmc_package(extra=[file_member("PMC4242/" + "../" * 5 + "tmp/x", b"x")])
    results: list[SourceItem | ItemError] = []
    with pytest.raises(SourceError) as err:
        for result in iter_pmc_package(
            io.BytesIO(package), "late.tar.gz", max_image_bytes=MB, max_members=100, max_total_bytes=10 * MB
        ):
            results.append(result)
    assert err.value.error_type == "hostile_package"
    assert results == []


def test_pmc_truncated_package_is_refused() -> None:
    package = pmc_package(gz=False)
    with pytest.raises(SourceError) as err:
        read_package(package[: len(package) // 2])
    assert err.value.error_type == "not_a_tar"
