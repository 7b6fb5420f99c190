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
    ledger_entries,
    runs,
    variant,
    verify_intact,
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


def test_a_racing_relinker_never_gets_the_outside_file_released(demo_dir, work, tmp_path, monkeypatch):  # noqa: F811
    """A thread flips the data file between itself and a symlink to an edited copy outside the
    roots (atomic renames) while five releases run: each is refused or releases the checked
    file; none fingerprints, charges or publishes the outside one (before the fix, 6 of 6 tries released it)."""
    import hashlib
    import threading

    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", "")
    data = demo_dir / demo.DATA_FILE
    inside = data.read_bytes()
    keep = demo_dir / ".kept.csv"
    keep.write_bytes(inside)
    outside = tmp_path / "outside.csv"
    cut = inside.index(b"\n") + 1
    digit = next(i for i in range(cut, len(inside)) if chr(inside[i]).isdigit())
    outside.write_bytes(inside[:digit] + str((inside[digit] - 48 + 1) % 10).encode() + inside[digit + 1 :])
    stop = threading.Event()

    def flip() -> None:
        link = demo_dir / ".link"
        while not stop.is_set():
            link.unlink(missing_ok=True)
            link.symlink_to(outside)
            os.replace(link, data)
            os.link(keep, link)
            os.replace(link, data)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    outcomes = []
    try:
        for _ in range(5):  # the demo's lifetime budget fits five
            try:
                release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
                outcomes.append("released")
            except UserError as error:
                assert any(why in str(error) for why in ("symbolic link", "outside the folders")), error
                outcomes.append("refused")
    finally:
        stop.set()
        flipper.join()
    fingerprints = {run.dataset_fingerprint for run in runs()} - {None}
    assert fingerprints <= {hashlib.sha256(inside).hexdigest()}, outcomes
    assert hashlib.sha256(outside.read_bytes()).hexdigest() not in fingerprints
    verify_intact()


def test_a_symlink_swapped_while_it_is_resolved_is_a_user_error(demo_dir, work, monkeypatch):  # noqa: F811
    """`--data` names a symlink (inside the roots) that the swapper replaces by a file just as
    the run resolves it: `Path.resolve` then raises a bare ``OSError: [Errno 22]`` (readlink of
    what is no longer a link), the racing runs' traceback of issue 15, item 10; now one
    UserError naming the path, and nothing is recorded."""
    data = demo_dir / demo.DATA_FILE
    link = demo_dir / "current.csv"
    link.symlink_to(data)
    real_readlink = os.readlink

    def swapped_first(path, *args, **kwargs):
        if str(path) == str(link) and link.is_symlink():
            link.unlink()
            shutil.copy(data, link)  # the swapper wins the race
        return real_readlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", swapped_first)
    with pytest.raises(UserError, match="changed while its symbolic links were resolved"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), data_path=str(link))
    assert runs() == []
