"""Open a data file by descriptor, exactly where confinement checked it.

Confinement (:func:`privrelease.policies.loader.confine`) checks the *real* path of a data
file (every symlink resolved) against the policy's folder and the data roots. A writer of the
data folder can still swap the file, or a folder on its path, for a symlink leading elsewhere
after that check. :func:`open_checked` therefore opens the checked real path following no
symlink at all: each folder with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's
descriptor, the file with ``O_NOFOLLOW`` (a symlink anywhere on the path now is refused,
``ELOOP``/``ENOTDIR``), then checks that the descriptor is a regular file and, where
``/proc/self/fd`` exists, that it still names the checked path (a folder moved meanwhile). Every
later read (fingerprint, parse) uses the returned file object, never the path again.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from privrelease.errors import UserError

_FOLDER = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a pipe does not hang the open
_SWAPPED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)  # EMLINK: FreeBSD's O_NOFOLLOW on a symlink


def open_checked(path: str | Path, *, what: str = "dataset file") -> BinaryIO:
    """The regular file at the absolute, symlink-free ``path`` (as confinement checked it),
    opened for binary reading without following any symlink. :class:`UserError` naming the
    path when it is missing, unreadable, not a regular file, or was relinked or moved since."""
    path = Path(path)
    assert path.is_absolute(), f"open_checked needs the checked absolute path; got {str(path)!r}"
    shown = str(path)
    try:
        folder = os.open(path.anchor, _FOLDER)
        try:
            for part in path.parts[1:-1]:
                inner = os.open(part, _FOLDER, dir_fd=folder)
                os.close(folder)
                folder = inner
            descriptor = os.open(path.name, _FILE, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError as error:
        if error.errno in _SWAPPED:
            raise UserError(
                f"{what} {shown!r} (or a folder on its path) became a symbolic link after it was checked: "
                "nothing was read from it; run again"
            ) from None
        if error.errno == errno.ENOENT:
            raise UserError(f"{what} {shown!r} does not exist or is not a file") from None
        raise UserError(f"cannot read {what} {shown!r}: {error.strerror or error}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise UserError(f"{what} {shown!r} is not a regular file (a folder, device, pipe or socket)")
        _require_named(descriptor, shown, what)
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def _require_named(descriptor: int, shown: str, what: str) -> None:
    """Linux: the descriptor's path (``/proc/self/fd``) is the checked one (or was: a file
    replaced since it was opened reads ``PATH (deleted)``, and is still the file opened there)."""
    try:
        named = os.readlink(f"/proc/self/fd/{descriptor}")
    except OSError:
        return  # no /proc: the component-wise open without symlinks is the check
    if named not in (shown, f"{shown} (deleted)"):
        raise UserError(f"{what} {shown!r} was moved while it was opened: nothing was read from it; run again")
