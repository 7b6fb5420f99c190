"""Release policies: the pydantic schema, YAML loading with line-numbered errors, canonical hash.

>>> from privrelease.policies import load_policy, policy_hash   # doctest: +SKIP
>>> loaded = load_policy("policies/examples/demo.yaml")          # doctest: +SKIP
>>> loaded.sha256 == policy_hash(loaded)                         # doctest: +SKIP
True
"""

from .canonical import canonical_json, hierarchy_sha256, policy_hash
from .loader import (
    LoadedPolicy,
    load_policy,
    load_policy_text,
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
    HistogramMechanism,
    IdentifiableStatisticMechanism,
    KeepScheme,
    LifetimeBudget,
    MapScheme,
    Mechanism,
    Policy,
    Scheme,
    SdgsMechanism,
    SelectScheme,
    SpluGenMechanism,
    SpluPrivacyTarget,
    SpluUtilityTarget,
    SuppressScheme,
    Targets,
    TopBottomScheme,
)

__all__ = [
    "BinsScheme",
    "ColumnSpec",
    "CsvOptions",
    "Dataset",
    "FieldError",
    "Hierarchy",
    "HierarchyScheme",
    "HistogramMechanism",
    "IdentifiableStatisticMechanism",
    "KeepScheme",
    "LifetimeBudget",
    "LoadedPolicy",
    "MapScheme",
    "Mechanism",
    "Policy",
    "Scheme",
    "SdgsMechanism",
    "SelectScheme",
    "SpluGenMechanism",
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
