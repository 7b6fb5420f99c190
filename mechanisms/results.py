"""What every mechanism returns: the output table, the privacy event it realized, and facts
split by who may see them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from privrelease.mechanisms.events import Event


@dataclass(frozen=True)
class Pieces:
    """An output too large to hold at once: tables of one ``schema``, written one at a time
    in this order (each piece already in uniformly random row order). ``remote``: where the
    rows can be computed elsewhere, a function of the number of workers and a map over them
    (``gather(function, items, **constants)``) splitting them over files (each row in a
    uniformly random one), each file as a picklable function giving its pieces (Dask workers
    compute and write the files where they run: :func:`privrelease.flows.outputs.write_remote`);
    each call draws its own split, and only one of ``tables`` and ``remote(...)`` is ever
    written."""

    schema: pa.Schema
    tables: Iterator[pa.Table]
    remote: Callable[[int, Callable[..., list[Any]]], Sequence[Callable[[], Iterator[pa.Table]]]] | None = None


@dataclass(frozen=True)
class MechanismResult:
    """``table``: the output to publish (rows never in input order).
    ``event``: the privacy event the run realized (accounted by the accountants).
    ``public_facts``: policy-derived or aggregate facts safe to publish with the data
    (e.g. parameters, output row count). ``internal_facts``: run facts that could themselves
    disclose (rows in, rows sampled, cells suppressed, rows dropped): internal review only.
    ``cells``: see below."""

    table: pa.Table | Pieces
    event: Event
    public_facts: dict[str, Any] = field(default_factory=dict)
    internal_facts: dict[str, Any] = field(default_factory=dict)
    cells: pa.Table | None = None
    tables: dict[str, pa.Table] = field(default_factory=dict)
    """A companion output published beside ``table`` (its file ``<name>.cells``), a
    post-processing of it: SDGS microdata's published cells, each with its row count and the
    exact interval for the people behind it (:func:`.sdgs.published_cells_table`).
    ``tables``: a release of several tables (``noisy_tables``): part name -> table, each
    published as its own file ``<mechanism>-<part>`` (``table`` is then the first of them)."""
