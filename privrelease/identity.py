"""The identity of the population a dataset is about (a policy's ``dataset.id``): the key of
the lifetime privacy budget, shared by every file (vintage) about the same people."""

from __future__ import annotations

import re
from typing import Any

PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
ALLOWED = "1-100 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
EXAMPLE = "adult-census"


def problem(value: Any, name: str = "id") -> str | None:
    """Why ``value`` is not a dataset identity (a message naming ``name``), or None."""
    if isinstance(value, str) and PATTERN.fullmatch(value):
        return None
    return f"{name} must be a short slug of {ALLOWED} (e.g. {EXAMPLE}); got {value!r}"
