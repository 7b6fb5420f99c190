"""``privrelease policy init``: a draft policy from a data file's header and types only.

A generalization scheme must be fixed before the data is read (Li, Qardaji, Su: the scheme is
data-independent), so the draft never looks at a value: a CSV gives its header line (every
column drafted as text: its type would take reading values), a Parquet file its schema (names
and types). Every choice in the draft is a commented placeholder for the custodian to review;
`privrelease plan` then checks it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from privrelease.errors import UserError


def _parquet_columns(path: Path) -> list[tuple[str, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from privrelease.datafiles import open_checked

    try:
        with open_checked(path) as handle:
            schema = pq.read_schema(handle)
    except pa.ArrowInvalid as error:
        raise UserError(f"{str(path)!r} is not a readable Parquet file: {error}") from None
    return [(field.name, _parquet_type(field.type)) for field in schema]


def _parquet_type(kind: Any) -> str:
    """The policy's column type of a Parquet (Arrow) type."""
    import pyarrow as pa

    if pa.types.is_integer(kind):
        return "integer"
    return "float" if pa.types.is_floating(kind) else "string"


def _csv_columns(path: Path) -> tuple[list[tuple[str, str]], str]:
    """The header's names, read in the reader's own dialect (:func:`.csv_dialect.csv_first_line`)
    with the options the draft writes (UTF-8, the delimiter sniffed from the header line), and
    that delimiter."""
    from privrelease.csv_dialect import csv_first_line
    from privrelease.datafiles import open_checked

    with open_checked(path) as handle:
        first = handle.readline()
    if not first.strip():
        raise UserError(f"{str(path)!r} has no header line: the draft names its columns from it")
    dialect, names = csv_first_line(first, path)
    return [(name, "string") for name in names], dialect.delimiter


IDENTIFIER = re.compile(r"(^|[^a-z])(id|pid|person|patient|ssn|nhs)([^a-z]|$)|[a-z]id$", re.IGNORECASE)
"""A column name that looks like a person identifier (``patient_id``, ``PersonID``, ``ssn``)."""


def _person_lines(names: list[str]) -> list[str]:
    """The draft's commented ``person:`` lines: what a person is (the unit of privacy), and, when
    a column's name looks like an identifier (:data:`IDENTIFIER`; the name only, no value), that
    column as a suggestion."""
    lines = [
        "  # person: row                     # who one person is (the unit of privacy): row = each row is a different",
        "  #                                 # person (also when absent); {column: NAME, max_rows: 5}: every row with",
        "  #                                 # the same NAME is one person, at most 5 of them kept at random",
    ]
    suggested = next((name for name in names if IDENTIFIER.search(name)), None)
    if suggested is not None:
        lines.append(
            f"  # person: {{column: {json.dumps(suggested)}, max_rows: 5}}   # {json.dumps(suggested)} looks like a person "
            "identifier: if a person may have several rows, use it (and publish it nowhere: drop it from the "
            "generalization and the mechanisms' columns)"
        )
    return lines


def draft_policy(data: str | Path, dataset_id: str, policy_folder: str | Path = ".") -> str:
    """The YAML text of a draft policy for the data file ``data`` (CSV or Parquet, read for its
    header or schema only) of the population ``dataset_id``, with its path relative to
    ``policy_folder`` (where the draft will be written)."""
    import os

    from privrelease.identity import problem
    from privrelease.policies.loader import confine
    from privrelease.policies.schema import MECHANISM_TYPES

    if (why := problem(dataset_id, "--id")) is not None:
        raise UserError(why)
    # read only where `run` may read: the draft's folder and the data roots, no pseudo file system
    path = confine(Path(data).expanduser(), Path(policy_folder).expanduser(), what="data file")
    if not path.is_file():
        raise UserError(f"data file {str(data)!r} does not exist or is not a file")
    parquet = path.suffix.lower() in (".parquet", ".pq")
    if parquet:
        columns, delimiter = _parquet_columns(path), None
    else:
        columns, delimiter = _csv_columns(path)
    if not columns:
        raise UserError(f"{str(path)!r} names no column")
    relative = os.path.relpath(path, Path(policy_folder).expanduser().resolve())
    names = [json.dumps(name) for name, _ in columns]
    width = max(len(name) for name in names)
    read = "header and column types" if parquet else "header"
    lines = [
        f"# A draft release policy for {path.name}, written by `privrelease policy init` from the",
        f"# file's {read} only: no value was read, as a scheme fixed before the data requires.",
        "# Review every choice, then `privrelease plan` this file.",
        f"name: {json.dumps(dataset_id + '-release')}",
        'version: "1"',
        f"description: {json.dumps('Draft release of ' + dataset_id)}",
        "dataset:",
        f"  id: {json.dumps(dataset_id)}                 # the population: every file about these people shares one lifetime budget",
        f"  path: {json.dumps(relative)}",
        f"  format: {'parquet' if parquet else 'csv'}",
    ]
    if not parquet:
        lines.append(f"  csv: {{delimiter: {json.dumps(delimiter)}, header: true, encoding: utf-8}}")
    lines += [
        "  # rows: 10000                     # the number of rows, if it is public (a mean needs it)",
        "  missing: reject                   # or drop: rows with a missing value",
        *_person_lines([name for name, _ in columns]),
        "  columns:                          # type: integer, float or string; add values: [...] for a fixed domain",
    ]
    if not parquet:
        lines.append("    # every column is text until you say otherwise: its type would take reading values")
    lines += [f"    {name.ljust(width)}: {{type: {kind}}}" for name, (_, kind) in zip(names, columns, strict=True)]
    lines += [
        "generalization:                    # fixed before any data is read; per column one of:",
        "  # keep | suppress | {bins: [0, 18, 65, 120], labels: [...]} | {top_bottom: ...}",
        "  # | {map: {value: label}, default: other} | {hierarchy: FILE.csv, level: 1} (ARX format)",
        "  # Each column is kept raw only because the draft read no value: a raw column with many",
        "  # distinct values (an age, a zip code) leaves cells under k and the release publishes",
        "  # nothing. Declare its values and coarsen it (`privrelease plan` warns until then).",
    ]
    lines += [f"  {name.ljust(width)}: keep" for name in names]
    lines += [
        f"mechanisms:                        # type: one of {', '.join(MECHANISM_TYPES)}",
        "  - name: microdata",
        "    type: sdgs",
        f"    columns: [{', '.join(names)}]",
        "    beta: 0.1                      # each row sampled with this probability",
        "    k: 20                          # cells of fewer sampled rows are suppressed",
        "    epsilon: 1.0                   # the epsilon the guarantee is stated at",
        "targets:",
        "  accounting: approximate          # standard (eps, delta)-DP; or probabilistic (the papers' notion)",
        "  max_epsilon: 1.0",
        "  delta: 1.0e-9",
        "  lifetime_budget: {epsilon: 10, delta: 1.0e-6}   # shared by every release about these people",
        "  accuracy:                        # cells of 1,000 people published and within +-25%, 95% of the time",
        "    - {mechanism: microdata, count: 1000, relative_error: 0.25, confidence: 0.95}",
    ]
    return "\n".join(lines) + "\n"
