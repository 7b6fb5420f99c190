"""sha256 of bytes, text and files, and atomic writes: the one module every layer (but
:mod:`privrelease.mechanisms`, which does no I/O) hashes and writes files through.

An atomic write goes to a temp file beside the target (``.NAME.<random>.tmp``: a crash leaves
only such names, which :mod:`privrelease.flows.recovery` sweeps), then ``os.replace`` puts it
in place, so a reader sees the old file or the new one, never a part. ``durable=True`` also
fsyncs the file before the rename and the folder after it, so the new name survives a power
loss. A missing folder is refused (``FileNotFoundError``) unless ``make_folder=True``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20  # files are hashed 1 MiB at a time


def sha256_bytes(data: bytes) -> str:
    """sha256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """sha256 hex digest of the UTF-8 bytes of ``text``."""
    return sha256_bytes(text.encode("utf-8"))


def sha256_stream(handle: BinaryIO) -> tuple[str, int]:
    """``(sha256 hex digest, size)`` of an open binary file's bytes from where it stands to its
    end, read :data:`CHUNK` bytes at a time."""
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def sha256_file(path: str | Path) -> str:
    """sha256 hex digest of the file at ``path``, read in chunks (``OSError`` when it cannot be read)."""
    with open(path, "rb") as handle:
        return sha256_stream(handle)[0]


def fsync(path: str | Path) -> None:
    """Flush a file, or a folder's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def atomic_path(
    path: str | Path, *, durable: bool = False, make_folder: bool = False, mode: int | None = None
) -> Iterator[Path]:
    """A new, empty temp file beside ``path`` for the block to write (by name: for writers that
    take a path, such as pyarrow's); when the block ends without error it replaces ``path``
    (fsynced first, and the folder after, when ``durable``); on any error it is removed.
    ``mode``: the file's permission bits (default: 0o666 less the umask, as ``open`` makes)."""
    target = Path(path)
    if make_folder:
        target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        if mode is not None:
            os.chmod(temp, mode)
        yield temp
        if durable:
            fsync(temp)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if durable:
        fsync(target.parent)


def write_atomic(
    path: str | Path,
    content: bytes | str | Callable[[Path], object],
    *,
    durable: bool = True,
    make_folder: bool = False,
    mode: int | None = None,
) -> Path:
    """Write ``content`` (bytes; text, as UTF-8; or a function writing the temp path it is
    given) to ``path`` atomically through :func:`atomic_path`; returns the path."""
    with atomic_path(path, durable=durable, make_folder=make_folder, mode=mode) as temp:
        if callable(content):
            content(temp)
        else:
            temp.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return Path(path)


def private_folder(path: str | Path) -> Path:
    """``path`` made if missing (with its parents) and kept ``0700``: only this account can list
    or enter it, whatever the umask (the work folder's server state, run records). A folder this
    account does not own cannot be made private: ``PermissionError``."""
    folder = Path(path)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o777 != 0o700:
        os.chmod(folder, 0o700)
    return folder
