"""The canonical form and content hash of a policy (what an approval records).

canonical JSON = ``{"canonical_version": 1, "policy": <dump>}`` with sorted keys and no whitespace,
where ``<dump>`` is the validated policy with every default filled in, floats written by their
shortest round-trip form (``0.1`` and ``1e-1`` are the same float), and each hierarchy file path
replaced by ``"sha256:<hex>"`` of its parsed rows; ``dataset.id``, ``dataset.sha256`` and ``approval``
are left out when absent (so a policy written before the fields existed keeps its hash), and
``engine`` always (where the data work runs changes no output distribution, so it is not part of
what is approved). So comments, key order, quoting and YAML layout do not change the hash; any
other value, or the content of a hierarchy file, does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from privrelease.files import sha256_text

from .schema import Hierarchy, Policy

CANONICAL_VERSION = 1


def policy_canonical_json(policy: Policy, hierarchies: Mapping[str, Hierarchy]) -> str:
    """Canonical JSON of ``policy`` with ``hierarchies`` (column -> parsed rows)."""
    body = policy.model_dump(mode="python", exclude={"engine"})  # where it runs changes no output distribution
    for optional in ("id", "sha256"):
        if body["dataset"][optional] is None:
            del body["dataset"][optional]  # absent: policies written before the field keep their hash
    if body["approval"] is None:
        del body["approval"]
    for scheme, column in _hierarchy_schemes(body):
        scheme["hierarchy"] = "sha256:" + hierarchy_sha256(hierarchies[column])
    document = {"canonical_version": CANONICAL_VERSION, "policy": _normalize(body)}
    return json.dumps(
        document,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def policy_sha256(policy: Policy, hierarchies: Mapping[str, Hierarchy]) -> str:
    """sha256 (hex) of :func:`policy_canonical_json`."""
    return sha256_text(policy_canonical_json(policy, hierarchies))


def hierarchy_sha256(rows: Hierarchy) -> str:
    """sha256 of a hierarchy's parsed rows (as compact JSON): line endings and BOMs do not count."""
    text = json.dumps([list(row) for row in rows], separators=(",", ":"), ensure_ascii=False)
    return sha256_text(text)


def _hierarchy_schemes(body: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The dumped hierarchy schemes with their column."""
    found = [(s, c) for c, s in body["generalization"].items() if s["type"] == "hierarchy"]
    for schemes in body["candidate_schemes"].values():
        found.extend((s, c) for c, s in schemes.items() if s["type"] == "hierarchy")
    return found


def _normalize(value: Any) -> Any:
    """Plain JSON values: tuples as lists, floats as floats (``-0.0`` as ``0.0``)."""
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if isinstance(value, float):
        return value + 0.0
    assert value is None or isinstance(value, (str, int, bool)), f"not canonical JSON: {value!r}"
    return value
