"""The docstring examples of the calculus modules are tests too."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "privrelease.mechanisms.events",
    "privrelease.mechanisms.sdgs_math",
    "privrelease.mechanisms.identifiability",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
