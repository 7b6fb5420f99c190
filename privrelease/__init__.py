"""privrelease: publish data about people with provable disclosure guarantees.

The import namespace is ``privrelease``; its parts live in top-level folders
(``policies/`` is ``privrelease.policies``, ``mechanisms/`` is ``privrelease.mechanisms``, ...),
mapped in ``pyproject.toml``. The Python API (:mod:`privrelease.api`), one function per
command: ``load``, ``plan``, ``compose``, ``runway``, ``verify``, ``run``, ``rerun``, ``reissue``,
``approve``, ``revoke``, ``ledger``, ``list_ledgers``, ``report``, ``list_reports``, ``estimate``
and ``count_intervals``, imported on first use so that ``import privrelease`` stays light.

Importing it also turns off transparent huge pages for the large arrays numpy and Arrow
allocate (``NUMPY_MADVISE_HUGEPAGE=0``, ``MIMALLOC_ALLOW_THP=0``), unless the environment sets
them: both read them once, when they are loaded, so this only acts when ``privrelease`` is
imported before numpy and pyarrow (the CLI, the flows and Dask workers started by a process
that imported it). Measured on 2-core machines shared with other test suites, where the
kernel's ``defrag=madvise`` lets a huge-page fault stall in direct compaction: 10 M-row SDGS
end to end (bench/sdgs.py's worker, fresh processes, alternated) took 0.53-0.62 s without
huge pages against 0.40-1.42 s with them at beta 0.1, and 1.09-1.38 s against 1.26-1.56 s at
beta 0.5 (pair ratios 0.39-1.44 and 0.74-1.04, medians about 0.9); reading 20 M rows took
0.47-0.52 s without against 0.34-1.34 s with. Without them the best runs are slower and the
spread is far smaller. Set either variable to 1 to keep huge pages.
"""

import os
from typing import Any

os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")

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
