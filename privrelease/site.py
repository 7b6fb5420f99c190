"""The site file: what the data custodian pins for every release on this host, where the
person who runs releases cannot change it.

``/etc/privrelease/site.yaml`` (:data:`SITE_FILE`, a fixed path: no setting or option moves
it) is owned by the custodian and read-only to the runner. The environment can tighten what it
pins, never loosen it (:func:`pin`)::

    production: true                                  # every run is a production run
    approvers: /etc/privrelease/approvers.yaml        # the only registry approvals count against
    witness: /var/lib/privrelease/audit.witness.json  # PRIVRELEASE_WITNESS: unset or this file
    public_key: /etc/privrelease/agency.key.pub       # the service key every record is signed with
    releases: [/srv/share/releases]                   # published release folders: their signed heads are checked
    work: /var/lib/privrelease/work                   # the work folder: one audit database, one ledger per host

What it stops (SECURITY.md): a runner who holds the service key and writes the audit database
rewriting its history without the governance records (production mode and the registry are
the site's), naming a fresh witness after putting back an older copy of the database (the
witness is the site's), or hiding a newer release from the check (the published folders are
the site's). ``work`` pins the work folder (PRIVRELEASE_WORK_DIR: unset or this folder), which
otherwise follows the current directory: ``audit init`` run elsewhere would start a second audit
database, a second ledger for the same ``dataset.id`` (two budgets for one population), and a
second kept Prefect server. Every run's check before spending and ``audit verify`` read them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from privrelease.errors import UserError

__all__ = ["SITE_FILE", "Site", "load", "pin", "stamp"]

SITE_FILE = Path("/etc/privrelease/site.yaml")


class Site(BaseModel):
    """The pins of a site file (every one optional; ``source``: the file, None without one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    production: bool = False
    approvers: Path | None = None
    witness: Path | None = None
    public_key: str | None = None
    releases: tuple[Path, ...] = ()
    work: Path | None = None
    source: Path | None = None

    @field_validator("approvers", "witness", "work")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"must be an absolute path; got {str(value)!r}")
        return value

    @field_validator("releases", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("releases")
    @classmethod
    def _absolute_folders(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        relative = [str(folder) for folder in value if not folder.is_absolute()]
        if relative:
            raise ValueError(f"must be absolute folder paths; got {relative[0]!r}")
        return value

    @field_validator("public_key")
    @classmethod
    def _public_key(cls, value: str | None) -> str | None:
        from privrelease.audit import signing

        if value is not None and signing.decode_public(value) is None:
            if not Path(value).is_absolute():
                raise ValueError(f"must be the key (base64) or the absolute path of its .pub file; got {value!r}")
            signing.public_key(value)  # a .pub file holding the key
        return value

    def writable(self) -> list[Path]:
        """The site file and the files it pins as they are (the registry, a public key file) that
        this process's account can change, or replace in their folder, a symlink followed too:
        they pin nothing against that account. (The witness is written by every run.)"""
        pinned = [self.source, self.approvers, Path(self.public_key) if self.public_key else None]
        files = [file for file in pinned if file is not None and file.is_file()]
        return [
            file
            for file in files
            if any(os.access(path, os.W_OK) or os.access(path.parent, os.W_OK) for path in (file, file.resolve()))
        ]

    def verifying_key(self) -> Any | None:
        """The pinned service public key (None: none pinned)."""
        from privrelease.audit import signing

        return signing.public_key(self.public_key) if self.public_key else None


FIELDS = (
    "production (true/false), approvers, witness, public_key (absolute paths; the key also as base64), releases, work"
)


def stamp() -> tuple[int, int, int] | None:
    """What identifies the site file's content now (inode, size, mtime), None without one: part
    of the settings' cache key, so an edited site file is read again."""
    try:
        found = os.stat(SITE_FILE)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UserError(f"the site file {str(SITE_FILE)!r} cannot be read: {error.strerror or error}") from None
    return (found.st_ino, found.st_size, found.st_mtime_ns)


def load() -> Site:
    """The site file's pins (an empty :class:`Site` without one); a :class:`UserError` names the
    file, the field, the value and what is allowed."""
    import yaml

    where = f"the site file {str(SITE_FILE)!r}"
    try:
        body = yaml.safe_load(SITE_FILE.read_bytes())
    except FileNotFoundError:
        if (link := _dangling_link()) is not None:
            raise UserError(
                f"{where} cannot be read: {str(link)!r} is a symbolic link to {os.readlink(link)!r}, which does not "
                "exist (it would pin nothing); restore its target or remove the link"
            ) from None
        return Site()
    except OSError as error:
        raise UserError(f"{where} cannot be read: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise UserError(f"{where} is not valid YAML ({str(error).splitlines()[0]})") from None
    if body is None:  # an empty file pins nothing
        body = {}
    if not isinstance(body, dict):
        raise UserError(f"{where} must be a mapping of {FIELDS}; got {type(body).__name__}")
    try:
        return Site.model_validate({**body, "source": SITE_FILE})
    except ValidationError as error:
        item = error.errors()[0]
        field = ".".join(map(str, item["loc"])) or "?"
        message = str(item["msg"]).removeprefix("Value error, ")
        raise UserError(
            f"{where}: {field}={item.get('input')!r} is not valid ({message}); it may set {FIELDS}",
            field=field,
        ) from None


def _dangling_link() -> Path | None:
    """The site file's path, or a folder on it, when it is a symbolic link that resolves to
    nothing: the site file is then not absent but lost (None: no such link)."""
    for path in (SITE_FILE, *SITE_FILE.parents):
        if path.is_symlink() and not path.exists():
            return path
    return None


def pin(settings: Any, site: Site) -> Any:
    """``settings`` under the site's pins: production on when the site says so, the witness and
    the approver registry the site's (a ``PRIVRELEASE_WITNESS`` or ``PRIVRELEASE_APPROVERS`` naming
    another file is a :class:`UserError`: it would loosen the site), the work folder the site's
    (a ``PRIVRELEASE_WORK_DIR`` naming another is a :class:`UserError`; the default audit database
    follows it)."""
    if site.work is not None:
        _pin_work(settings, site)
    for name in ("witness", "approvers"):
        pinned: Path | None = getattr(site, name)
        chosen: str = getattr(settings, name)
        if pinned is None:
            continue
        if chosen and Path(chosen).expanduser().resolve() != pinned.resolve():
            variable = f"PRIVRELEASE_{name.upper()}"
            raise UserError(
                f"{variable}={chosen!r} names another file than the site file {str(site.source)!r} pins "
                f"({name}: {str(pinned)!r}): unset {variable}",
                field=variable,
            )
        setattr(settings, name, str(pinned))
    settings.production = settings.production or site.production
    settings._site = site
    return settings


def _pin_work(settings: Any, site: Site) -> None:
    """The work folder the site pins, and the default audit database in it."""
    assert site.work is not None
    work = site.work.resolve()
    chosen = next((value for name, value in os.environ.items() if name.upper() == "PRIVRELEASE_WORK_DIR"), "")
    if chosen and Path(chosen).expanduser().resolve() != work:
        raise UserError(
            f"PRIVRELEASE_WORK_DIR={chosen!r} names another folder than the site file {str(site.source)!r} pins "
            f"(work: {str(site.work)!r}): unset PRIVRELEASE_WORK_DIR",
            field="PRIVRELEASE_WORK_DIR",
        )
    if settings.db_url == f"sqlite:///{settings.work_dir / 'audit.db'}":
        settings.db_url = f"sqlite:///{work / 'audit.db'}"
    settings.work_dir = work
