"""No data value is persisted anywhere but the outputs: a unique token is planted in the input
(a bad number, an undeclared category, a column name) and in the environment, release flows run
and fail on it under Prefect, and every byte Prefect (its database, logs, result storage), the
audit database and the work folder keep is searched for it. Only the operator's terminal may
see it (the DataStepError's ``detail``)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from privrelease import demo
from privrelease.errors import UserError
from privrelease.flows.steps import DataStepError


def _planted(demo_dir: Path, token: str, where: str) -> Path:
    """A copy of the demo data with ``token`` planted: in a number, a category or the header."""
    lines = (demo_dir / demo.DATA_FILE).read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").replace('"', "").split(",")
    if where == "header":
        lines[0] = lines[0].replace("education", token, 1)
    else:
        column = header.index("hours-per-week" if where == "number" else "sex")
        cells = lines[7].rstrip("\n").split(",")
        cells[column] = token
        lines[7] = ",".join(cells) + "\n"
    path = demo_dir / f"planted-{where}.csv"
    path.write_text("".join(lines))
    return path


def _persisted_roots(work: Path) -> list[Path]:
    """Every place Prefect and privrelease keep bytes for these runs."""
    from prefect.settings import (
        PREFECT_API_DATABASE_CONNECTION_URL,
        PREFECT_HOME,
        PREFECT_LOCAL_STORAGE_PATH,
    )

    roots = [work, Path(PREFECT_HOME.value()), Path(PREFECT_LOCAL_STORAGE_PATH.value())]
    url = PREFECT_API_DATABASE_CONNECTION_URL.value() or ""
    if "sqlite" in url:
        roots.append(Path(url.split("///", 1)[1]).parent)
    return [root for root in roots if root.exists()]


def _hits(roots: list[Path], token: bytes) -> list[str]:
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            try:
                if path.is_file() and token in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return sorted(set(found))


def test_planted_values_are_never_persisted(prefect_harness, demo_dir, work, monkeypatch, caplog):
    from prefect.logging.handlers import APILogHandler

    from privrelease.flows.release import release

    token = "PLANTED" + secrets.token_hex(8)
    monkeypatch.setenv("PRIVRELEASE_TEST_PLANTED", token + "-env")
    policy = str(demo_dir / demo.POLICY_FILE)
    seen_on_terminal = []
    for where in ("number", "category", "header"):
        data = _planted(demo_dir, token, where)
        with pytest.raises((DataStepError, UserError)) as caught:
            release(policy_path=policy, data_path=str(data))
        detail = getattr(caught.value, "detail", str(caught.value))
        seen_on_terminal.append(token in detail)
        assert token not in str(caught.value)
    assert seen_on_terminal == [True, True, False]  # the operator sees the bad cell; nobody the header
    APILogHandler().flush()  # logs reach the API database
    assert token not in caplog.text
    roots = _persisted_roots(work)
    assert any(root == work for root in roots) and len(roots) >= 2, roots
    assert _hits(roots, token.encode()) == []
    assert _hits(roots, (token + "-env").encode()) == []
    assert _hits(roots, b"PLANTED") == []  # no fragment either
    # the search reads what Prefect persisted: the safe failure text is in its database
    persisted = _hits(roots, b"details withheld")
    assert any(path.endswith(".db") or ".db-" in path for path in persisted if not path.startswith(str(work))), (
        persisted
    )
    assert any(path.startswith(str(work)) for path in persisted), persisted  # and in the audit database
