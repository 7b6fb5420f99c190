"""The docstring examples of the calculus modules, the Python API's and the README's are tests too."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULES = [
    "privrelease.mechanisms.events",
    "privrelease.mechanisms.sdgs_math",
    "privrelease.mechanisms.identifiability",
    "privrelease.api",
    "privrelease.settings",
    "privrelease.audit.registered",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the examples name policies by their path in the checkout
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_readme_python_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = doctest.testfile(str(REPO / "README.md"), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
