"""Safe unpacking of uploaded archives: every escape is refused before anything is written."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from app.core.errors import InvalidUploadError
from app.core.inputs import archive_suffix, check_archive, unpack

LIMITS = {"max_bytes": 1_000_000, "max_members": 50}


def _tar(path: Path, members: list[tuple[str, str, bytes | str]]) -> Path:
    """members: (kind, name, data-or-link-target) with kind file, dir, sym, hard or fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            if kind in ("sym", "hard"):
                assert isinstance(payload, str)
                info.linkname = payload
            tar.addfile(info)
    return path


def test_a_model_directory_unpacks_to_its_single_top_directory(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "m.tar.gz", [("dir", "model", b""), ("file", "model/config.json", b"{}"),
                                            ("file", "model/sub/deep.json", b"[]")])
    root = unpack(archive, tmp_path / "out", **LIMITS)
    assert root == tmp_path / "out" / "model"
    assert (root / "config.json").read_bytes() == b"{}" and (root / "sub" / "deep.json").read_bytes() == b"[]"
    assert oct((root / "config.json").stat().st_mode & 0o777) == oct(0o644)


def test_a_link_inside_the_archive_is_refused_too(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "m.tar.gz", [("file", "model/config.json", b"{}"),
                                            ("sym", "model/alias.json", "config.json")])
    with pytest.raises(InvalidUploadError, match="tar -h"):
        unpack(archive, tmp_path / "out", **LIMITS)
    assert not (tmp_path / "out").exists()


def test_a_member_twice_or_as_file_and_directory_is_refused(tmp_path: Path) -> None:
    twice = _tar(tmp_path / "twice.tar.gz", [("file", "a.csv", b"1"), ("file", "./a.csv", b"2")])
    with pytest.raises(InvalidUploadError, match="twice"):
        unpack(twice, tmp_path / "out", **LIMITS)
    both = _tar(tmp_path / "both.tar.gz", [("file", "a", b"1"), ("file", "a/b.csv", b"2")])
    with pytest.raises(InvalidUploadError, match="both as a file and a directory"):
        unpack(both, tmp_path / "out2", **LIMITS)


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("file", "a.csv", b"1"), ("file", "./a.csv", b"2")], "'a.csv' twice"),
        ([("file", "a", b"1"), ("file", "a/b.csv", b"2")], "'a' both as a file"),
        ([("file", "m/x/b.csv", b"1"), ("file", "m/x", b"2")], "'m/x' both as a file"),
        ([("file", "m/x", b"1"), ("dir", "m/x", b"")], "'m/x' both as a file"),
    ],
    ids=["twice", "file-then-directory", "directory-then-file", "file-then-directory-entry"],
)
def test_the_upload_check_refuses_what_the_unpacker_could_not_write(
    tmp_path: Path, members: list, message: str
) -> None:
    archive = _tar(tmp_path / "spool-1234.tar.gz", members)
    with pytest.raises(InvalidUploadError, match=message) as refused:
        check_archive(archive, **LIMITS, shown="dataset.tar.gz")
    assert str(refused.value).startswith("dataset.tar.gz ") and "spool-1234" not in str(refused.value)
    with pytest.raises(InvalidUploadError, match=message):
        unpack(archive, tmp_path / "out", **LIMITS)


def test_the_upload_check_accepts_directory_entries_in_any_order(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "m.tar.gz", [("file", "model/sub/a.json", b"{}"), ("dir", "model/sub", b""),
                                            ("dir", "model", b""), ("dir", "./", b""), ("dir", "model/", b"")])
    check_archive(archive, **LIMITS)
    assert (unpack(archive, tmp_path / "out", **LIMITS) / "sub" / "a.json").read_bytes() == b"{}"


def test_flat_archives_unpack_in_place_and_zip_works_too(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "d.zip", "w") as zf:
        zf.writestr("train.csv", "text,label\n")
        zf.writestr("test.csv", "text,label\n")
    root = unpack(tmp_path / "d.zip", tmp_path / "out", **LIMITS)
    assert root == tmp_path / "out" and sorted(p.name for p in root.iterdir()) == ["test.csv", "train.csv"]


@pytest.mark.parametrize(
    "members",
    [
        [("file", "../escape.txt", b"x")],
        [("file", "a/../../escape.txt", b"x")],
        [("file", "/tmp/absolute.txt", b"x")],
        [("sym", "link", "../../outside")],
        [("sym", "link", "/etc/passwd")],
        [("file", "a.txt", b"x"), ("hard", "b.txt", "../a.txt")],
        [("fifo", "pipe", b"")],
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink-out", "symlink-absolute", "hardlink-out", "fifo"],
)
def test_escaping_members_are_refused_and_nothing_is_left(tmp_path: Path, members: list) -> None:
    archive = _tar(tmp_path / "bad.tar.gz", members)
    with pytest.raises(InvalidUploadError):
        check_archive(archive, **LIMITS)
    with pytest.raises(InvalidUploadError):
        unpack(archive, tmp_path / "out", **LIMITS)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path.parent / "escape.txt").exists()


def test_zip_escapes_and_links_are_refused(tmp_path: Path) -> None:
    for name in ("../evil.txt", "/abs.txt", "C:/windows.txt", "a\\..\\..\\evil.txt"):
        with zipfile.ZipFile(tmp_path / "bad.zip", "w") as zf:
            zf.writestr(name, "x")
        with pytest.raises(InvalidUploadError):
            unpack(tmp_path / "bad.zip", tmp_path / "out", **LIMITS)
        assert not (tmp_path / "out").exists()
    link = zipfile.ZipInfo("link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(tmp_path / "link.zip", "w") as zf:
        zf.writestr(link, "/etc/passwd")
    with pytest.raises(InvalidUploadError, match="link"):
        check_archive(tmp_path / "link.zip", **LIMITS)


def test_bombs_stop_at_the_limits(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "big.tar.gz", [("file", "zeros", bytes(2_000_000))])
    assert os.path.getsize(archive) < 50_000
    with pytest.raises(InvalidUploadError, match="unpacks to more than"):
        unpack(archive, tmp_path / "out", **LIMITS)
    many = _tar(tmp_path / "many.tar.gz", [("file", f"f{i}", b"x") for i in range(60)])
    with pytest.raises(InvalidUploadError, match="more than 50 members"):
        unpack(many, tmp_path / "out2", **LIMITS)
    with zipfile.ZipFile(tmp_path / "big.zip", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros", bytes(2_000_000))
    with pytest.raises(InvalidUploadError, match="unpacks to more than"):
        unpack(tmp_path / "big.zip", tmp_path / "out3", **LIMITS)


def test_a_zip_whose_header_understates_its_size_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "liar.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros", bytes(2_000_000))
    with zipfile.ZipFile(path) as zf:
        info = zf.infolist()[0]
    # Rewrite the declared size in the central directory to something tiny.
    raw = bytearray(path.read_bytes())
    central = raw.rfind(b"PK\x01\x02")
    raw[central + 24:central + 28] = (10).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    assert info.file_size == 2_000_000
    with pytest.raises(InvalidUploadError):
        unpack(path, tmp_path / "out", **LIMITS)
    assert not (tmp_path / "out").exists()


def test_not_an_archive_and_empty_archives(tmp_path: Path) -> None:
    (tmp_path / "junk.tar.gz").write_bytes(b"hello")
    with pytest.raises(InvalidUploadError, match="not a tar or zip"):
        unpack(tmp_path / "junk.tar.gz", tmp_path / "out", **LIMITS)
    empty = _tar(tmp_path / "empty.tar.gz", [])
    with pytest.raises(InvalidUploadError, match="empty"):
        unpack(empty, tmp_path / "out2", **LIMITS)
    assert not (tmp_path / "out2").exists()
    assert archive_suffix("Model.TAR.GZ") == ".tar.gz" and archive_suffix("x.csv") is None
