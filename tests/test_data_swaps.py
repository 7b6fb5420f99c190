"""A writer of the data folder swaps the data file, or a folder on its path, for a symlink
leading out of the data roots after the run checked the path (issue 15, item 6). The run opens
the checked real path once, following no symlink (:mod:`privrelease.datafiles`), and reads
through that descriptor: it is refused, and the outside file is never read nor charged."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from test_flow_steps import (  # noqa: F401 (fixtures)
    assert_nothing_published,
    demo_dir,
    demo_source,
    ledger_entries,
    runs,
    variant,
    verify_intact,
    work,
)

from privrelease import datafiles, demo
from privrelease.errors import UserError
from privrelease.flows import steps
from privrelease.flows.steps import release_plain


def _relink(path: Path, target: Path) -> None:
    """Replace ``path`` (a file or a folder) by a symlink to ``target``, atomically."""
    link = path.with_name(f".{path.name}.swap")
    link.symlink_to(target)
    if path.is_dir() and not path.is_symlink():
        path.rename(path.with_name(f".{path.name}.old"))
    os.replace(link, path)


@pytest.mark.parametrize("component", ["the file", "its folder"])
def test_data_relinked_out_of_the_roots_after_the_check_is_never_read(demo_dir, work, tmp_path, monkeypatch, component):  # noqa: F811
    """Between `open_run` (the path confined to the policy folder and the data roots) and the
    fingerprint, the file (or its folder) becomes a symlink to a file outside: before the fix the
    release was computed from, and charged for, the outside file."""
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", "")
    (demo_dir / "data").mkdir()
    data = demo_dir / "data" / demo.DATA_FILE
    shutil.move(demo_dir / demo.DATA_FILE, data)
    policy = variant(demo_dir, "sub", (f"path: {demo.DATA_FILE}", f"path: data/{demo.DATA_FILE}"))
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(data, outside / demo.DATA_FILE)  # same header and rows: only its bytes tell it apart
    original = steps.prepare_outputs

    def then_swap(run):
        result = original(run)
        if component == "the file":
            _relink(data, outside / demo.DATA_FILE)
        else:
            _relink(data.parent, outside)
        return result

    monkeypatch.setattr(steps, "prepare_outputs", then_swap)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(str(path)) or real_open(path, *a, **k))
    with pytest.raises(UserError, match="became a symbolic link after it was checked: nothing was read"):
        release_plain(policy_path=str(policy))
    assert not any(str(outside) in path for path in opened)
    (run,) = runs()
    assert run.status == "failed" and run.dataset_fingerprint is None
    assert ledger_entries() == []  # nothing reserved, nothing charged
    assert_nothing_published(work / "releases")
    verify_intact()


def test_open_checked_follows_no_symlink(tmp_path):
    """The checked real path opens; a symlink as the file or as any folder on the path, a
    folder and a pipe are refused (the pipe without blocking)."""
    (tmp_path / "real").mkdir()
    file = tmp_path / "real" / "data.csv"
    file.write_bytes(b"a\n1\n")
    with datafiles.open_checked(file) as handle:
        assert handle.read() == b"a\n1\n"
    (tmp_path / "link.csv").symlink_to(file)
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    for path in (tmp_path / "link.csv", tmp_path / "linked" / "data.csv"):
        with pytest.raises(UserError, match="became a symbolic link"):
            datafiles.open_checked(path)
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", tmp_path / "real"):
        with pytest.raises(UserError, match="not a regular file"):
            datafiles.open_checked(path)
    with pytest.raises(UserError, match="does not exist"):
        datafiles.open_checked(tmp_path / "absent.csv")
