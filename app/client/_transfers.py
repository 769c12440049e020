"""Moving files: downloads that resume and are checked, and uploads (a directory packed first, deterministically).

A download whose target is already there with the manifest's sha256 is not fetched again (a re-run).

A download writes into ``<name>.partial`` beside its target. When a transfer breaks off it asks for
the rest with ``Range``, guarded by ``If-Range`` on the artifact's sha256 (its ETag), so a changed
artifact is sent whole rather than spliced; the finished file must match the manifest's sha256
before it takes its name. The ``.partial`` file survives a failure, so running the command again
resumes too.
"""

from __future__ import annotations

import gzip
import hashlib
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

from app.client._exceptions import ChecksumError, ClientError, TransportError, httpx_errors, problem_from_response
from app.client._records import ArtifactEntry
from app.client._retries import Outage


def download(http: httpx.Client, job_id: str, artifact: ArtifactEntry, directory: Path, *, timeout: float | None,
             on_retry: Callable[[str], None] | None) -> Path:
    """Download ``artifact`` of ``job_id`` into ``directory``, resuming a ``.partial`` file; its path.

    The server may be away for ``timeout`` seconds at a time (reset whenever bytes arrive).
    Raises :class:`ChecksumError` when the bytes do not match the manifest's sha256.
    """
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / Path(artifact.name).name
    if target.is_file() and target.stat().st_size == artifact.size and sha256_of(target) == artifact.sha256:
        return target  # a re-run: this file is already here, whole and checked
    partial = target.with_name(target.name + ".partial")
    url = f"/v1/jobs/{job_id}/artifacts/{artifact.name}"
    outage = Outage(timeout, None, on_retry, f"the download of {artifact.name}")
    while True:
        have = _size(partial)
        if have > artifact.size:
            partial.unlink()
            have = 0
        if have == artifact.size:
            break
        try:
            _fetch(http, url, partial, have=have, etag=f'"{artifact.sha256}"')
        except ClientError as exc:
            if _size(partial) > have:
                outage.ok()  # it was making progress: a new break, not a longer outage
            outage.failed(exc)  # sleeps before the next try, or raises
    digest = sha256_of(partial)
    if digest != artifact.sha256:
        partial.unlink(missing_ok=True)
        raise ChecksumError(f"{artifact.name}: sha256 {digest} differs from the manifest's {artifact.sha256}; "
                            "download it again")
    partial.replace(target)
    return target


def _fetch(http: httpx.Client, url: str, partial: Path, *, have: int, etag: str) -> None:
    """One GET of the rest of the artifact, appended to ``partial``; raises on a broken transfer."""
    headers = {"Range": f"bytes={have}-", "If-Range": etag} if have else {}
    with httpx_errors("the connection broke"), http.stream("GET", url, headers=headers) as response:
        if response.status_code == 416:
            partial.unlink(missing_ok=True)  # our partial file is not a prefix of it: start again
            raise TransportError("the partial download does not fit the artifact; restarting")
        if response.status_code >= 400:
            response.read()
            raise problem_from_response(response)
        resume = response.status_code == 206 and response.headers.get("content-range", "").startswith(
            f"bytes {have}-")
        with open(partial, "ab" if resume else "wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)


#: The suffixes the server tells uploads apart by (longest first: ``.tar.gz`` before ``.gz``).
_UPLOAD_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip", ".csv", ".jsonl", ".parquet")


def upload_suffix(name: str) -> str:
    """The suffix that decides what the server takes a file named ``name`` for (``.tar.gz``, ``.csv``...)."""
    lower = name.lower()
    return next((suffix for suffix in _UPLOAD_SUFFIXES if lower.endswith(suffix)), Path(lower).suffix)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


#: The modification time every packed member carries (and the gzip header): 2000-01-01, a fixed date.
PACKED_MTIME = 946684800


@contextmanager
def packed(path: Path) -> Iterator[Path]:
    """``path`` itself when it is a file; a directory packed as ``<name>.tar.gz`` in a temporary directory.

    The packing is deterministic: the same files give the same bytes, whoever packs them and when
    (members sorted by name, every time :data:`PACKED_MTIME`, owner root with no names, mode 0644 for
    files and 0755 for directories, a gzip header without name or time). So its sha256 names its content,
    and a second submit of an unchanged directory finds the first upload (:meth:`ApiClient.upload`).
    Links are followed, as ``tar -h`` does: the server accepts files and directories only.
    """
    if not path.is_dir():
        yield path
        return
    name = path.resolve().name or "upload"
    with tempfile.TemporaryDirectory(prefix="cahp-pack-") as tmp:
        archive = Path(tmp) / f"{name}.tar.gz"
        with open(archive, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=PACKED_MTIME) as zipped, \
                tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for source, arcname in _members(path, name):
                info = _info(tar, source, arcname)
                if info.isdir():
                    tar.addfile(info)
                    continue
                with open(source, "rb") as handle:
                    tar.addfile(info, handle)
        yield archive


def _members(root: Path, name: str) -> Iterator[tuple[Path, str]]:
    """``(path, name in the archive)`` of ``root`` and everything below it, sorted by name (links followed)."""
    yield root, name
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        arcname = f"{name}/{entry.name}"
        if entry.is_dir():
            yield from _members(entry, arcname)
        else:
            yield entry, arcname


def _info(tar: tarfile.TarFile, source: Path, arcname: str) -> tarfile.TarInfo:
    """A normalised header for ``source``: what identifies the content is its name and bytes only."""
    info = tar.gettarinfo(str(source.resolve()), arcname=arcname)
    info.mtime, info.uid, info.gid, info.uname, info.gname = PACKED_MTIME, 0, 0, "", ""
    info.pax_headers = {}
    if not (info.isdir() or info.isfile()):
        raise ValueError(f"{source} is neither a file nor a directory; the server accepts only those")
    info.mode = 0o755 if info.isdir() else 0o644
    return info


@contextmanager
def multipart_file(path: Path) -> Iterator[Callable[[], dict[str, Any]]]:
    """A factory of httpx's ``files`` for a form field ``file``: a fresh handle for each try, all closed at the end."""
    handles: list[IO[bytes]] = []

    def files() -> dict[str, Any]:
        handles.append(open(path, "rb"))  # noqa: SIM115 - closed below, after every try
        return {"file": (path.name, handles[-1])}

    try:
        yield files
    finally:
        for handle in handles:
            handle.close()
