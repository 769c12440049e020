"""A directory packs to the same bytes whoever packs it and whenever: its sha256 names its content."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path

from app.client._transfers import PACKED_MTIME, packed, upload_suffix


def _digest(directory: Path) -> tuple[str, bytes]:
    with packed(directory) as archive:
        data = archive.read_bytes()
        assert archive.name == f"{directory.name}.tar.gz"
    return hashlib.sha256(data).hexdigest(), data


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("second")
    (root / "a.txt").write_text("first")
    (root / "sub" / "c.json").write_text("{}")
    return root


def test_the_same_files_pack_to_the_same_bytes_whatever_their_times_modes_and_order(tmp_path: Path) -> None:
    one = _tree(tmp_path / "one" / "model")
    two = tmp_path / "two" / "model"
    (two / "sub").mkdir(parents=True)
    # Written in another order, at another time, with other modes.
    (two / "sub" / "c.json").write_text("{}")
    (two / "a.txt").write_text("first")
    (two / "b.txt").write_text("second")
    for path in (two / "a.txt", two / "sub" / "c.json"):
        os.utime(path, (1_000_000, 1_000_000))
        path.chmod(0o600)
    digest, data = _digest(one)
    assert _digest(two)[0] == digest
    assert _digest(one)[1] == data  # and again, later

    (tmp_path / "packed.tar.gz").write_bytes(data)
    with tarfile.open(tmp_path / "packed.tar.gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["model", "model/a.txt", "model/b.txt", "model/sub", "model/sub/c.json"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(PACKED_MTIME, 0, 0, "", "")}
    assert {m.name: m.mode for m in members}["model/a.txt"] == 0o644 and members[0].mode == 0o755


def test_a_changed_file_changes_the_digest_and_links_are_packed_as_the_files_they_name(tmp_path: Path) -> None:
    root = _tree(tmp_path / "model")
    digest, _ = _digest(root)
    (root / "a.txt").write_text("changed")
    assert _digest(root)[0] != digest

    linked = tmp_path / "linked" / "model"
    shutil.copytree(root, linked)
    (linked / "a.txt").unlink()
    (linked / "a.txt").symlink_to(root / "a.txt")
    assert _digest(linked)[0] == _digest(root)[0]  # as `tar -h` packs it: the server accepts no links


def test_a_file_is_uploaded_as_it_is_and_the_suffix_decides_its_kind(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("text,label\n")
    with packed(path) as same:
        assert same == path
    assert [upload_suffix(n) for n in ("m.tar.gz", "M.TGZ", "d.zip", "t.jsonl", "x.bin")] == [
        ".tar.gz", ".tgz", ".zip", ".jsonl", ".bin"]
