"""What an approval binds of the data a run may read (revision 0005), and who is running.

``policy approve`` resolves the policy's ``dataset.path`` against the policy's folder on the
approving host and binds either

* the **data** (``--binds data``, the default): the bytes whose fingerprint (the dataset
  sha256 a run records) it computed then, or the vintage ``dataset.sha256`` the policy pins; a
  run may read those bytes from any path it may read, and nothing else; or
* the **path** (``--binds path``): whatever file (or Parquet folder) is at that resolved
  absolute path when the run reads it, e.g. next month's extract of the same ``dataset.id``; a
  run may read that path only (its sha256 at approval is kept for the record).

The binding is recorded in the approval's row and signed with it
(:func:`privrelease.audit.approvers.message`). An approval without one (made before revision
0005) binds nothing, and no production run counts it: approve again.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any

__all__ = ["DATA", "KINDS", "PATH", "Account", "Binding", "bound", "os_account"]

DATA = "data"
PATH = "path"
KINDS = (DATA, PATH)


@dataclass(frozen=True)
class Binding:
    """``binds`` (:data:`DATA` or :data:`PATH`), the resolved absolute ``path`` of the data at
    approval and its fingerprint ``sha256`` (for :data:`DATA` the bytes bound; for :data:`PATH`
    what was there, None when it could not be read)."""

    binds: str
    path: str
    sha256: str | None

    @classmethod
    def of(cls, approval: Any) -> Binding | None:
        """The binding recorded in an ``Approval`` row (None: it binds nothing)."""
        if approval.binds not in KINDS or not approval.data_path:
            return None
        return cls(approval.binds, approval.data_path, approval.data_sha256)

    def signed(self) -> dict[str, Any]:
        """What the approval's signature covers of it."""
        return {"binds": self.binds, "path": self.path, "sha256": self.sha256}

    def describe(self) -> str:
        """One phrase for people: what a run may read under this binding."""
        if self.binds == DATA:
            return f"the data with sha256 {self.sha256}, from any path (dataset.path was {self.path} when approved)"
        seen = f"sha256 {self.sha256} when approved" if self.sha256 else "not readable when approved"
        return f"whatever is at the path {self.path} ({seen})"

    def refusal(self, path: str, sha256: str | None) -> str | None:
        """Why a run reading ``path`` whose fingerprint is ``sha256`` (None: not known yet, then
        a data binding holds until the run fingerprints the data) may not go by this binding;
        None when it may. ``path`` is compared resolved (symlinks followed)."""
        if self.binds == PATH:
            real = os.path.realpath(path)
            return None if real == self.path else f"it binds the path {self.path}, not {real}"
        if sha256 is None or sha256 == self.sha256:
            return None
        bound = self.sha256[:12] if self.sha256 is not None else "(none recorded)"
        return f"it binds the data with sha256 {bound}, but {path} has sha256 {sha256[:12]}"


def bound(approval: Any) -> str:
    """What an ``Approval`` row binds, for people (:meth:`Binding.describe`)."""
    binding = Binding.of(approval)
    return binding.describe() if binding is not None else "no data (approved before approvals bound it)"


@dataclass(frozen=True)
class Account:
    """An operating-system account: its ``name`` and ``uid`` (None: not recorded)."""

    name: str
    uid: int | None = None

    def same(self, name: str | None, uid: int | None) -> bool:
        """True when the account recorded as ``name`` / ``uid`` is this one (either matches)."""
        return name == self.name or (uid is not None and uid == self.uid)


def os_account() -> Account:
    """The account this process runs as: its effective uid and that uid's name in the password
    database, never ``LOGNAME`` or ``USER`` (any caller sets those); ``uid N`` when the
    password database has no entry for it."""
    uid = os.geteuid()
    try:
        return Account(pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return Account(f"uid {uid}", uid)
