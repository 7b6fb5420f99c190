"""Step 7 of a release: run one policy mechanism (through :mod:`.registry`, in-process or
finished from the Dask partials) and write its output to the staging folder."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv

from privrelease.flows.context import (
    OutputFacts,
    RunContext,
    _write_error,
    mechanism_step,
    plan_of,
    safe_name,
    withholding,
)
from privrelease.flows.data import _partials, _table


def plain_columns(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded (for CSV)."""
    return pa.table(
        {
            name: column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
            for name, column in zip(table.column_names, table.columns, strict=True)
        }
    )


def write_table(table: pa.Table, path: Path, output_format: str) -> None:
    """Write ``table`` to ``path`` (Parquet or CSV) through a temp file in the same folder and
    ``os.replace``; the temp file is removed on any error."""
    from privrelease.datasets import write_parquet

    temp = path.with_name(f".{path.name}.tmp")
    try:
        if output_format == "parquet":
            write_parquet(table, temp)
        else:
            try:
                pcsv.write_csv(
                    plain_columns(table),
                    temp,
                    pcsv.WriteOptions(quoting_style="needed"),
                )
            except OSError as error:
                raise _write_error(path, error) from None
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def run_mechanism(run: RunContext, name: str) -> OutputFacts:
    """Run the policy mechanism ``name`` on the run's data (on Dask: finish it from the merged
    partial results with its :mod:`.registry` entry's ``finish``) and write its output to the
    staging folder. The realized event must be the planned one (what was reserved)."""
    from privrelease.audit.chain import file_sha256
    from privrelease.mechanisms.events import event_to_json

    loaded = run.loaded()
    spec = loaded.policy.mechanism(name)
    step = mechanism_step(spec)
    file = f"{safe_name(name)}.{run.output_format}"
    path = run.staging_dir / file
    from privrelease.flows import registry
    from privrelease.flows.scaled import Finished

    with withholding(step):
        if run.engine.scaled:
            finish = registry.MECHANISMS[spec.type].finish
            assert finish is not None, f"verify_policy refuses {spec.type} on Dask"
            result = finish(loaded, spec, _partials[run.run_id][name], path, run.output_format)
        else:
            result = Finished.of(registry.run(loaded, spec, _table(run)))
    planned = {m.name: m.event for m in plan_of(run.policy).mechanisms}
    assert result.event == planned[name], (
        f"mechanism {name!r} realized {result.event!r}, but the plan (and the reservation) has {planned[name]!r}"
    )
    if result.table is not None:
        write_table(result.table, path, run.output_format)
    return OutputFacts(
        mechanism=name,
        type=spec.type,
        file=file,
        sha256=file_sha256(path),
        rows=result.rows,
        bytes=path.stat().st_size,
        event_json=event_to_json(result.event),
        public_facts=_jsonable(result.public_facts),
        internal_facts=_jsonable(result.internal_facts),
    )


def _jsonable(value: Any) -> Any:
    """Facts as plain JSON values (numpy scalars to Python, tuples to lists)."""
    return json.loads(json.dumps(value, default=_plain))


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
