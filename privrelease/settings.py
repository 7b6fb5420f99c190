"""Runtime settings, read from the environment (prefix ``PRIVRELEASE_``) by pydantic-settings.

=================================  ===============================================================
``PRIVRELEASE_WORK_DIR``           working folder (default ``<cwd>/privrelease-work``)
``PRIVRELEASE_DB_URL``             audit database URL (default ``sqlite:///<work_dir>/audit.db``;
                                   PostgreSQL: ``postgresql+psycopg://user:pw@host/db``)
``PRIVRELEASE_PRODUCTION``         ``true``: a run refuses a policy whose hash is not approved
``PRIVRELEASE_SIGNING_KEY``        Ed25519 private key file (``privrelease audit keygen``): audit
                                   records and release folders are signed with it
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
                                   a run (default 1800)
=================================  ===============================================================

>>> Settings(work_dir="/tmp/w").db_url
'sqlite:////tmp/w/audit.db'
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of privrelease that is not part of a policy."""

    model_config = SettingsConfigDict(env_prefix="PRIVRELEASE_", extra="ignore")

    work_dir: Path = Field(default_factory=lambda: Path.cwd() / "privrelease-work")
    db_url: str = ""
    production: bool = False
    default_lifetime_budget: tuple[float, float] | None = None
    reservation_ttl_seconds: float = Field(default=3600.0, gt=0)
    data_roots: str = ""
    signing_key: str = ""
    approvers: str = ""
    auto_init: bool = False
    server_reuse: bool = True
    server_idle_seconds: float = Field(default=1800.0, ge=0)

    @property
    def roots(self) -> tuple[Path, ...]:
        """``data_roots`` as resolved folders."""
        return tuple(Path(part).expanduser().resolve() for part in self.data_roots.split(os.pathsep) if part.strip())

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
    "db_url": "a database URL such as sqlite:///path/audit.db or postgresql+psycopg://user:pw@host/db",
    "production": "true or false",
    "default_lifetime_budget": "a JSON pair '[epsilon, delta]', e.g. '[10, 1e-6]', epsilon >= 0, delta in [0, 1)",
    "reservation_ttl_seconds": "a number of seconds > 0, e.g. 3600",
    "data_roots": "folder paths separated by ':'",
    "auto_init": "true or false",
    "signing_key": "the path of an Ed25519 PEM key file (privrelease audit keygen)",
    "approvers": "the path of an approver registry YAML file (README: Signed approvals)",
    "server_reuse": "true or false",
    "server_idle_seconds": "a number of seconds >= 0, e.g. 1800",
}


def get_settings() -> Settings:
    """The settings as the environment says now (cheap; not cached, so tests may change env).
    A malformed variable is a :class:`~privrelease.errors.UserError` naming every bad one, its
    value and the expected form."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as error:
        from privrelease.errors import UserError

        problems = []
        for item in error.errors():
            field = str(item["loc"][0]) if item["loc"] else ""
            expected = EXPECTED.get(field, item["msg"])
            problems.append(
                (f"PRIVRELEASE_{field.upper()}", f"{item.get('input')!r} is not valid: expected {expected}")
            )
        variable, _ = problems[0]
        raise UserError(
            "; ".join(f"{name}={text}" for name, text in problems),
            field=variable,
            allowed=EXPECTED.get(variable[12:].lower()),
        ) from None
