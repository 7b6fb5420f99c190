"""The canonical form and content hash of a policy (what an approval records).

canonical JSON = ``{"canonical_version": 1, "policy": <dump>}`` with sorted keys and no whitespace,
where ``<dump>`` is the validated policy with every default filled in, floats written by their
shortest round-trip form (``0.1`` and ``1e-1`` are the same float), and each hierarchy file path
replaced by ``"sha256:<hex>"`` of its parsed rows; ``dataset.id``, ``dataset.sha256``,
``dataset.person`` and ``approval``
are left out when absent (so a policy written before the fields existed keeps its hash), and
``engine`` always (where the data work runs changes no output distribution, so it is not part of
what is approved). So comments, key order, quoting and YAML layout do not change the hash; any
other value, or the content of a hierarchy file, does.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from privrelease.files import sha256_text

from .schema import Hierarchy, Policy

CANONICAL_VERSION = 1


def policy_canonical_json(policy: Policy, hierarchies: Mapping[str, Hierarchy]) -> str:
    """Canonical JSON of ``policy`` with ``hierarchies`` (column -> parsed rows)."""
    body = policy.model_dump(mode="python", exclude={"engine"})  # where it runs changes no output distribution
    for optional in ("id", "sha256", "person"):
        if body["dataset"][optional] is None:
            del body["dataset"][optional]  # absent: policies written before the field keep their hash
    for target in body["targets"]["accuracy"]:
        for optional in ("statistic", "table", "cells"):
            if target[optional] is None:
                del target[optional]  # absent: targets written before the field keep their hash
    for spec, mechanism in zip(policy.mechanisms, body["mechanisms"], strict=True):
        for *parents, name in spec.omitted_when_absent:
            section = mechanism
            for parent in parents:
                section = section[parent]
            if section[name] is None:
                del section[name]  # absent: policies written before the field keep their hash
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


def canonical_yaml(canonical: str) -> str:
    """The policy of a canonical JSON text (:func:`policy_canonical_json`) as YAML a person
    reads: keys in the schema's field order (the canonical text sorts them), an optional field
    left out when it is unset (``null``, its default), short lists and small mappings of plain
    values on one line. Loading it gives the same policy, hence the same canonical JSON and
    hash, except that a hierarchy file appears as the ``sha256:<hex>`` of its rows and ``engine``
    is absent (neither is part of what is approved). The file's comments and layout are not
    part of the canonical form: they cannot be recovered."""
    body = json.loads(canonical)["policy"]
    return yaml.dump(
        _schema_ordered(body, Policy),
        Dumper=_PolicyDumper,
        sort_keys=False,
        allow_unicode=True,
        width=2**31,  # a long value stays on its line
    )


def _schema_ordered(value: Any, annotation: Any) -> Any:
    """``value`` (dumped JSON) with each mapping's keys in the order of the model it validates
    against (``annotation``'s); keys the schema does not know keep their place at the end."""
    if isinstance(value, list):
        items = _item_annotations(annotation, len(value))
        return [_schema_ordered(item, inner) for item, inner in zip(value, items, strict=True)]
    if not isinstance(value, dict):
        return value
    model = _model_for(value, annotation)
    if model is None:
        inner = _mapping_value_annotation(annotation)
        return {key: _schema_ordered(item, inner) for key, item in value.items()}
    fields = model.model_fields
    ordered = {
        name: _schema_ordered(value[name], field.annotation)
        for name, field in fields.items()
        if name in value and not (value[name] is None and not field.is_required() and field.default is None)
    }
    ordered.update((key, item) for key, item in value.items() if key not in fields)
    return ordered


def _members(annotation: Any) -> list[Any]:
    """The alternatives of ``annotation`` with ``Annotated`` and unions unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [member for arg in typing.get_args(annotation) for member in _members(arg)]
    return [annotation]


def _model_for(value: dict[str, Any], annotation: Any) -> Any:
    """The pydantic model among ``annotation``'s alternatives that ``value`` is a dump of: the
    one whose ``Literal`` fields (a kind's ``type``, a noise's ``distribution``) match and that
    knows every key; ``None`` when ``annotation`` is a plain mapping."""
    models = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]

    def fits(model: Any) -> bool:
        for name, field in model.model_fields.items():
            literal = [m for m in _members(field.annotation) if typing.get_origin(m) is typing.Literal]
            if literal and name in value and value[name] not in typing.get_args(literal[0]):
                return False
        return set(value) <= set(model.model_fields)

    return next((m for m in models if fits(m)), models[0] if models else None)


def _mapping_value_annotation(annotation: Any) -> Any:
    for member in _members(annotation):
        if typing.get_origin(member) is dict:
            return typing.get_args(member)[1]
    return Any


def _item_annotations(annotation: Any, count: int) -> list[Any]:
    for member in _members(annotation):
        if typing.get_origin(member) in (tuple, list):
            args = typing.get_args(member)
            if len(args) == 2 and args[1] is Ellipsis or len(args) == 1:
                return [args[0]] * count
            if len(args) == count:
                return list(args)
    return [Any] * count


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _represent_list(dumper: Any, value: list[Any]) -> Any:
    flow = all(_plain(item) for item in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


def _represent_dict(dumper: Any, value: dict[str, Any]) -> Any:
    flow = 0 < len(value) <= 3 and all(_plain(item) for item in value.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", value.items(), flow_style=flow)


class _PolicyDumper(yaml.SafeDumper):
    """Block style, but a list of plain values or a small mapping of them on one line."""


_PolicyDumper.add_representer(list, _represent_list)
_PolicyDumper.add_representer(dict, _represent_dict)
