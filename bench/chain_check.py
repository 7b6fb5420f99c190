"""Benchmark of the check every run makes before it spends (not a test): a signed SQLite audit
database of RUNS complete releases (start, reservation, read, charge, two outputs, guarantee,
report, finish: about 10 records each), then, in a warm process, `audit verify --public-key`
over the whole chain (the baseline) against `witness.check_before_spending` from the witness
(records after its verified head, their signatures, the witnessed head and every ledger entry)
and from the genesis (no witness: the first run after an upgrade). Last line: one JSON object.

    python bench/chain_check.py [RUNS]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 300


def seconds(function, repeats: int = 5) -> float:
    """Median wall time of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="chain-check-"))
    os.environ.update(
        PRIVRELEASE_WORK_DIR=str(base / "work"),
        PRIVRELEASE_SIGNING_KEY=str(base / "agency.key"),
        PRIVRELEASE_AUTO_INIT="true",
    )
    from sqlmodel import Session

    from privrelease.audit import approvals, chain, ledger, records, signing, verification, witness
    from privrelease.audit.database import open_database, session
    from privrelease.files import sha256_text
    from privrelease.mechanisms.events import Laplace, event_to_json

    public = signing.public_key(signing.generate(base / "agency.key"))
    engine = open_database()
    text = '{"policy":{}}'
    facts = approvals.PolicyFacts("bench", "1", sha256_text(text), text)
    event = event_to_json(Laplace(scale=1e6, sensitivity=1.0))
    with session(engine) as s:
        approvals.register_policy(s, facts)
        records.register_dataset(
            s,
            "f" * 64,
            identity="census",
            size_bytes=1,
            row_count=1,
            lifetime_epsilon=1e3,
            lifetime_delta=1e-6,
            notion="probabilistic",
        )
    start = time.perf_counter()
    for number in range(RUNS):
        with session(engine) as s:
            run = records.start_run(s, policy_sha256=facts.sha256, code_version="bench", dataset_fingerprint="f" * 64)
            reservation = ledger.reserve(s, "census", run.id, event, "probabilistic")
        with session(engine) as s:
            records.record_data_read(s, run.id)
            ledger.commit(s, reservation)
            for name in ("cells.csv", "rows.csv"):
                records.record_output(s, run.id, base / f"{number}-{name}", sha256="0" * 64, size=1)
            records.record_guarantee(s, run.id, notion="probabilistic", event_json=event, epsilon=1e-6, delta=0.0)
            records.store_report(s, run.id, "<html></html>")
            records.finish_run(s, run.id, "succeeded")
    built = time.perf_counter() - start
    with session(engine, readonly=True) as s:
        count = chain.head(s).seq

    def full() -> None:
        with session(engine, readonly=True) as s:
            result = verification.verify(s, check_files=False, public_key=public)
            assert result.ok, result.first

    def check() -> None:
        with Session(engine) as s:  # not committed: the witness stays where the last run left it
            witness.check_before_spending(s)
            s.rollback()

    path = witness.path_for(engine)
    assert path is not None
    figures = {"runs": RUNS, "records": count, "build_s": round(built, 2)}
    figures["full_verify_s"] = round(seconds(full), 4)
    found = witness.read(path, public)
    assert found is not None
    figures["records_after_verified_head"] = count - found.verified.seq
    figures["check_from_witness_s"] = round(seconds(check), 4)
    kept = path.read_bytes()
    path.unlink()
    witness._verified.clear()
    figures["check_without_witness_s"] = round(seconds(check), 4)
    path.write_bytes(kept)
    print(
        f"{count} records: audit verify --public-key {figures['full_verify_s']:.3f} s; check before spending "
        f"from the witness {figures['check_from_witness_s']:.4f} s, from the genesis (no witness) "
        f"{figures['check_without_witness_s']:.3f} s"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
