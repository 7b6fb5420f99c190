"""Release policies: the pydantic schema, YAML loading with line-numbered errors, canonical hash.

>>> from privrelease.policies import load_policy, policy_hash   # doctest: +SKIP
>>> loaded = load_policy("policies/examples/demo.yaml")          # doctest: +SKIP
>>> loaded.sha256 == policy_hash(loaded)                         # doctest: +SKIP
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, eagerly, for type checkers
    from .canonical import hierarchy_sha256
    from .loader import (
        LoadedPolicy,
        canonical_json,
        load_policy,
        load_policy_text,
        policy_hash,
        read_hierarchy,
        resolve_path,
    )
    from .schema import (
        BinsScheme,
        ColumnSpec,
        CsvOptions,
        Dataset,
        FieldError,
        Hierarchy,
        HierarchyScheme,
        KeepScheme,
        LifetimeBudget,
        MapScheme,
        Mechanism,
        Policy,
        Scheme,
        SpluPrivacyTarget,
        SpluUtilityTarget,
        SuppressScheme,
        Targets,
        TopBottomScheme,
    )

_EXPORTS = {
    "BinsScheme": "schema",
    "ColumnSpec": "schema",
    "CsvOptions": "schema",
    "Dataset": "schema",
    "FieldError": "schema",
    "Hierarchy": "schema",
    "HierarchyScheme": "schema",
    "KeepScheme": "schema",
    "LifetimeBudget": "schema",
    "LoadedPolicy": "loader",
    "MapScheme": "schema",
    "Mechanism": "schema",
    "Policy": "schema",
    "Scheme": "schema",
    "SpluPrivacyTarget": "schema",
    "SpluUtilityTarget": "schema",
    "SuppressScheme": "schema",
    "Targets": "schema",
    "TopBottomScheme": "schema",
    "canonical_json": "loader",
    "hierarchy_sha256": "canonical",
    "load_policy": "loader",
    "load_policy_text": "loader",
    "policy_hash": "loader",
    "read_hierarchy": "loader",
    "resolve_path": "loader",
}
"""Name -> the submodule defining it, imported on first use (PEP 562): a mechanism kind can
import :mod:`.fields` without loading the whole schema, which is assembled from the kinds."""

__all__ = [
    "BinsScheme",
    "ColumnSpec",
    "CsvOptions",
    "Dataset",
    "FieldError",
    "Hierarchy",
    "HierarchyScheme",
    "KeepScheme",
    "LifetimeBudget",
    "LoadedPolicy",
    "MapScheme",
    "Mechanism",
    "Policy",
    "Scheme",
    "SpluPrivacyTarget",
    "SpluUtilityTarget",
    "SuppressScheme",
    "Targets",
    "TopBottomScheme",
    "canonical_json",
    "hierarchy_sha256",
    "load_policy",
    "load_policy_text",
    "policy_hash",
    "read_hierarchy",
    "resolve_path",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
