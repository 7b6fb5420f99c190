"""privrelease.files: sha256 of bytes, text and files, and atomic writes."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from privrelease.files import atomic_path, sha256_bytes, sha256_file, sha256_stream, sha256_text, write_atomic

ADULT_SHA256 = "c700df9304fbf3c4d4db5938bffc510561bd4a2dfad285a3feef9a20619391c5"  # SOURCE.md


def test_adult_sha256(adult_dir: Path) -> None:
    assert sha256_file(adult_dir / "adult.csv") == ADULT_SHA256
    with open(adult_dir / "adult.csv", "rb") as handle:
        assert sha256_stream(handle) == (ADULT_SHA256, 2_516_935)


def test_hashes_stream_large_files_and_agree_with_hashlib(tmp_path: Path) -> None:
    data = np.arange(700_000, dtype=np.int64).tobytes()  # 5.3 MiB: several 1 MiB chunks
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_file(path) == sha256_bytes(data) == expected
    with open(path, "rb") as handle:
        assert sha256_stream(handle) == (expected, len(data))
    assert sha256_text("café") == hashlib.sha256("café".encode()).hexdigest()
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "absent.bin")


def test_write_atomic_replaces_whole_files_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    assert write_atomic(target, "one") == target and target.read_text() == "one"
    write_atomic(target, b"two", durable=False)
    assert target.read_bytes() == b"two"
    write_atomic(target, lambda temp: temp.write_text("three"), mode=0o600)
    assert target.read_text() == "three" and stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(RuntimeError), atomic_path(target) as temp:
        temp.write_text("half")
        raise RuntimeError("cut short")
    assert target.read_text() == "three"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_missing_folder_is_refused_unless_asked_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "absent" / "x.json", "{}")
    assert not (tmp_path / "absent").exists()
    write_atomic(tmp_path / "made" / "deeper" / "x.json", "{}", make_folder=True)
    assert (tmp_path / "made" / "deeper" / "x.json").read_text() == "{}"


def test_default_mode_follows_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a.txt", "a")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640
