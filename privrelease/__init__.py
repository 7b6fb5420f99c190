"""privrelease: publish data about people with provable disclosure guarantees.

The import namespace is ``privrelease``; its parts live in top-level folders
(``policies/`` is ``privrelease.policies``, ``mechanisms/`` is ``privrelease.mechanisms``, ...),
mapped in ``pyproject.toml``. The Python API (:mod:`privrelease.api`), one function per
command: ``load``, ``plan``, ``compose``, ``runway``, ``verify``, ``run``, ``rerun``, ``reissue``,
``approve``, ``revoke``, ``ledger``, ``list_ledgers``, ``report``, ``list_reports``, ``estimate``
and ``count_intervals``, imported on first use so that ``import privrelease`` stays light.
"""

from typing import Any

from privrelease.version import VERSION

__version__ = VERSION

API = (
    "load",
    "plan",
    "compose",
    "runway",
    "verify",
    "run",
    "rerun",
    "reissue",
    "approve",
    "revoke",
    "ledger",
    "list_ledgers",
    "report",
    "list_reports",
    "estimate",
    "count_intervals",
)


def __getattr__(name: str) -> Any:
    if name in API:
        from privrelease import api

        return getattr(api, name)
    raise AttributeError(f"module 'privrelease' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
