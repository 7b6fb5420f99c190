"""Runtime settings, read from the environment (prefix ``PRIVRELEASE_``) by pydantic-settings.

=================================  ===============================================================
``PRIVRELEASE_WORK_DIR``           working folder (default: the site file's ``work``, else
                                   ``<cwd>/privrelease-work``)
``PRIVRELEASE_DB_URL``             audit database URL (default ``sqlite:///<work_dir>/audit.db``;
                                   PostgreSQL: ``postgresql+psycopg://user:pw@host/db``), checked
                                   when read: a SQLite file or a PostgreSQL host and database
``PRIVRELEASE_PRODUCTION``         ``true``: a run refuses a policy whose hash is not approved
``PRIVRELEASE_SIGNING_KEY``        Ed25519 private key file (``privrelease audit keygen``): audit
                                   records and release folders are signed with it
``PRIVRELEASE_WITNESS``            the witness file: the newest chain head, signed, kept outside the
                                   database; every run checks the database against it before it
                                   spends (default: beside a SQLite file, ``<file>.witness.json``;
                                   else ``<work_dir>/audit-witness-<url digest>.json``)
``PRIVRELEASE_APPROVERS``          approver registry (YAML: approver name -> Ed25519 public key);
                                   ``audit mode production`` pins it and production runs then
                                   count only approvals signed by a registered key
``PRIVRELEASE_AUTO_INIT``          ``true``: create the audit database on first use (throwaway
                                   work, tests); otherwise only ``audit init`` and ``demo`` do
``PRIVRELEASE_DATA_ROOTS``         folders (``:``-separated) data and hierarchy files may be read
                                   from, besides the policy's own folder
``PRIVRELEASE_DEFAULT_LIFETIME_BUDGET``  ``[epsilon, delta]`` for datasets whose policy names none
``PRIVRELEASE_RESERVATION_TTL_SECONDS``  a budget reservation not committed within this many
                                   seconds (a crashed run) expires and stops counting
``PRIVRELEASE_SERVER_REUSE``       ``false``: each run starts a temporary Prefect server of its own
                                   instead of keeping one in the work folder (:mod:`privrelease.server`)
``PRIVRELEASE_SERVER_IDLE_SECONDS``  the kept Prefect server stops after this many seconds without
                                   a run (default 1800), and the kept runner too
``PRIVRELEASE_RUNNER``             ``false``: keep no runner in the work folder (each ``run`` and
                                   ``rerun`` imports Prefect itself: :mod:`privrelease.resident`)
=================================  ===============================================================

The site file (:mod:`privrelease.site`) pins production mode, the witness and the approver
registry where the runner cannot change them: the environment can tighten it, never loosen it.

Other ``PRIVRELEASE_*`` names are read by the deploy scripts (:data:`DEPLOY_VARIABLES`), set by
privrelease for its own child processes (:data:`CHILD_VARIABLES`) or read by the test suite
(``PRIVRELEASE_TEST_*``); any other is a mistake that :func:`unknown_variables` names.

>>> Settings(work_dir="/tmp/w").db_url
'sqlite:////tmp/w/audit.db'
>>> unknown_variables({"PRIVRELEASE_DB_ULR": "sqlite:///a.db", "PRIVRELEASE_REPO": "."})
['PRIVRELEASE_DB_ULR is not a privrelease setting (ignored); did you mean PRIVRELEASE_DB_URL?']
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from privrelease.site import Site

PREFIX = "PRIVRELEASE_"
DEPLOY_VARIABLES = (  # read by deploy/*.sh, which `privrelease deploy` runs (deploy/README.md)
    "PRIVRELEASE_REPO",
    "PRIVRELEASE_PREFECT_PORT",
    "PRIVRELEASE_WORK_POOL",
    "PRIVRELEASE_PREFECT_FILE",
    "PRIVRELEASE_PREFECT_START_TIMEOUT",
)
CHILD_VARIABLES = ("PRIVRELEASE_SERVER_TOKEN",)  # set by privrelease for its own child processes (the kept server)
TEST_PREFIX = "PRIVRELEASE_TEST_"
DATABASE_DRIVERS = {"sqlite": "pysqlite", "postgresql": "psycopg"}


NO_LIFETIME_BUDGET = (
    "no lifetime budget for the dataset: set targets.lifetime_budget in the policy or "
    "PRIVRELEASE_DEFAULT_LIFETIME_BUDGET='[epsilon, delta]'"
)
"""Why a release that charges a budget is refused without one (the policy's, else the setting)."""


class Settings(BaseSettings):
    """Every knob of privrelease that is not part of a policy."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    work_dir: Path = Field(default_factory=lambda: Path.cwd() / "privrelease-work")
    db_url: str = ""
    production: bool = False
    default_lifetime_budget: tuple[float, float] | None = None
    """The lifetime budget a dataset is registered with when its policy states none (:data:`NO_LIFETIME_BUDGET`)."""
    reservation_ttl_seconds: float = Field(default=3600.0, gt=0)
    data_roots: str = ""
    signing_key: str = ""
    witness: str = ""
    approvers: str = ""
    auto_init: bool = False
    server_reuse: bool = True
    server_idle_seconds: float = Field(default=1800.0, ge=0)
    runner: bool = True
    _site: Site | None = PrivateAttr(default=None)

    @property
    def site(self) -> Site:
        """The site file's pins (:mod:`privrelease.site`), already applied to these settings."""
        from privrelease.site import Site

        return self._site or Site()

    @property
    def roots(self) -> tuple[Path, ...]:
        """``data_roots`` as resolved folders."""
        return tuple(Path(part).expanduser().resolve() for part in self.data_roots.split(os.pathsep) if part.strip())

    @field_validator("db_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        if value:
            problem = database_url_problem(value)
            if problem:
                raise PydanticCustomError("database_url", "{reason}", {"reason": problem, "shown": masked_url(value)})
        return value

    @field_validator("default_lifetime_budget")
    @classmethod
    def _budget_in_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None:
            epsilon, delta = value
            if not epsilon >= 0:
                raise ValueError(f"default_lifetime_budget epsilon must be >= 0; got {epsilon}")
            if not 0 <= delta < 1:
                raise ValueError(f"default_lifetime_budget delta must be in [0, 1); got {delta}")
        return value

    @model_validator(mode="after")
    def _default_db_url(self) -> Settings:
        self.work_dir = self.work_dir.expanduser().resolve()
        if not self.db_url:
            self.db_url = f"sqlite:///{self.work_dir / 'audit.db'}"
        return self


EXPECTED = {
    "work_dir": "a folder path",
    "db_url": "sqlite:///PATH/audit.db (a file; sqlite:////abs/path/audit.db for an absolute path) or "
    "postgresql+psycopg://USER:PASSWORD@HOST[:PORT]/DATABASE",
    "production": "true or false",
    "default_lifetime_budget": "a JSON pair '[epsilon, delta]', e.g. '[10, 1e-6]', epsilon >= 0, delta in [0, 1)",
    "reservation_ttl_seconds": "a number of seconds > 0, e.g. 3600",
    "data_roots": "folder paths separated by ':'",
    "auto_init": "true or false",
    "signing_key": "the path of an Ed25519 PEM key file (privrelease audit keygen)",
    "witness": "the path of the witness file (a place database writers cannot write)",
    "approvers": "the path of an approver registry YAML file (README: Signed approvals)",
    "server_reuse": "true or false",
    "server_idle_seconds": "a number of seconds >= 0, e.g. 1800",
    "runner": "true or false",
}


def database_url_problem(value: str) -> str | None:
    """Why ``value`` cannot be an audit database URL (None: it can), as SQLAlchemy parses it.

    >>> database_url_problem("sqlite://x.db")
    "'x.db' is read as a host: a SQLite file follows three slashes, e.g. sqlite:///x.db"
    >>> database_url_problem("postgresql+psycopg://u:pw@db.example:5432/audit") is None
    True
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(value)
    except ArgumentError:
        return "not a URL"
    except ValueError:  # SQLAlchemy's int() of the port
        return "its port is not a number"
    try:
        driver = url.get_driver_name()  # loads the dialect when the URL names no driver
    except NoSuchModuleError:
        driver = None
    if driver is None or DATABASE_DRIVERS.get(url.get_backend_name()) != driver:
        return f"{url.drivername!r} is not a supported database"
    if not 0 < (url.port or 1) < 65536:
        return f"port {url.port} is not in 1-65535"
    if url.get_backend_name() == "sqlite":
        if url.host:
            return f"{url.host!r} is read as a host: a SQLite file follows three slashes, e.g. sqlite:///{url.host}"
        if sqlite_file(url) is None:
            return "an in-memory SQLite database keeps no audit history"
    elif not (url.host or url.query.get("host")):
        return "it names no host"
    elif not url.database:
        return "it names no database"
    return None


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL (None: an in-memory database); of a URI filename too
    (``sqlite:///file:/PATH?mode=ro&uri=true``, a read-only connection)."""
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:") or url.query.get("mode") == "memory":
        return None
    if url.query.get("uri") == "true":
        database = database.removeprefix("file:")
    return Path(database).expanduser()


def masked_url(value: str) -> str:
    """``value`` as written, with its password (if any) shown as ``***``."""
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        return "<not shown: an unparseable URL>"
    if password is None:
        return value
    host = parts.netloc.rpartition("@")[2]
    return value.replace(parts.netloc, f"{parts.username}:***@{host}", 1)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``PRIVRELEASE_*`` name in ``environ`` that nothing reads (a typo is
    otherwise silently ignored), with the closest known name."""
    fields = [name.upper() for name in Settings.model_fields]
    known = [PREFIX + field for field in fields]
    warnings = []
    for name in sorted(environ):
        upper = name.upper()
        if (
            not upper.startswith(PREFIX)
            or upper.startswith(TEST_PREFIX)
            or upper in (*known, *DEPLOY_VARIABLES, *CHILD_VARIABLES)
        ):
            continue
        close = difflib.get_close_matches(upper.removeprefix(PREFIX), fields, n=1)
        hint = f"did you mean {PREFIX}{close[0]}?" if close else f"the settings are {', '.join(known)}"
        warnings.append(f"{name} is not a privrelease setting (ignored); {hint}")
    return warnings


def signing_key() -> Any | None:
    """The configured private key (``PRIVRELEASE_SIGNING_KEY``), or None when none is set."""
    from privrelease.audit import signing

    path = get_settings().signing_key
    return signing.private_key(path, "PRIVRELEASE_SIGNING_KEY") if path else None


def get_settings() -> Settings:
    """The settings as the environment says now, under the site file's pins
    (:func:`privrelease.site.pin`): built once per distinct environment (the ``PRIVRELEASE_*``
    variables, the working and home folders they resolve against, the site file's content), so
    a change to any of them is seen by the next call. A malformed variable is a
    :class:`~privrelease.errors.UserError` naming every bad one, its value and the expected form
    (never cached)."""
    from privrelease import site

    ours = tuple(sorted((name, value) for name, value in os.environ.items() if name.upper().startswith(PREFIX)))
    return _settings(ours, os.getcwd(), os.environ.get("HOME"), site.SITE_FILE, site.stamp())


@functools.lru_cache(maxsize=16)
def _settings(
    variables: tuple[tuple[str, str], ...], cwd: str, home: str | None, site_file: Path, site_stamp: object
) -> Settings:
    """:class:`Settings` from the environment and the site file, for :func:`get_settings` (its
    arguments are the cache key: what the settings depend on)."""
    from pydantic import ValidationError

    from privrelease import site

    try:
        return site.pin(Settings(), site.load())
    except ValidationError as error:
        from privrelease.errors import UserError

        problems = []
        for item in error.errors():
            field = str(item["loc"][0]) if item["loc"] else ""
            expected = EXPECTED.get(field, item["msg"])
            ours = item["type"] == "database_url"  # its value shown masked, with the reason
            shown = item["ctx"]["shown"] if ours else item.get("input")
            reason = f" ({item['msg']})" if ours else ""
            problems.append((f"{PREFIX}{field.upper()}", f"{shown!r} is not valid{reason}: expected {expected}"))
        variable, _ = problems[0]
        raise UserError(
            "; ".join(f"{name}={text}" for name, text in problems),
            field=variable,
            allowed=EXPECTED.get(variable.removeprefix(PREFIX).lower()),
        ) from None
