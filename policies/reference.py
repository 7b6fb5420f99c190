"""The policy format, described from its own schema: the JSON Schema an editor's YAML language
server reads (``privrelease policy schema``; the example policies name it in a
``# yaml-language-server: $schema=...`` comment) and the field reference page generated from it
(``docs/policy-reference.md``; a test keeps both files in sync with the schema).

>>> schema = json_schema()
>>> schema["title"], "Dataset" in schema["$defs"]
('Policy', True)
"""

from __future__ import annotations

import json
from typing import Any

from .schema import Policy

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE = "docs/policy.schema.json"
REFERENCE_FILE = "docs/policy-reference.md"


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a release policy (pydantic's, with its dialect named). Ranges and
    cross-field rules that the schema cannot state are in each field's ``description`` and
    are checked by ``privrelease plan``."""
    return {"$schema": SCHEMA_DIALECT, **Policy.model_json_schema()}


def schema_text() -> str:
    """:func:`json_schema` as the text of ``docs/policy.schema.json``."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def _type(spec: dict[str, Any]) -> str:
    """A field's type in words (references as links to their section)."""
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    if "enum" in spec:
        return " or ".join(f"`{json.dumps(value)}`" for value in spec["enum"])
    if "anyOf" in spec or "oneOf" in spec:
        options = [_type(option) for option in spec.get("anyOf", spec.get("oneOf", [])) if option.get("type") != "null"]
        return " or ".join(dict.fromkeys(options))
    kind = spec.get("type", "any")
    if kind == "array":
        return f"list of {_type(spec.get('items', {}))}"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"map of name to {_type(spec['additionalProperties'])}"
    return {"number": "number", "integer": "integer", "string": "text", "boolean": "true/false"}.get(kind, kind)


def _allowed(spec: dict[str, Any]) -> str:
    found = [spec["description"]] if "description" in spec else []
    for option in spec.get("anyOf", []):
        if "description" in option:
            found.append(option["description"])
    return "; ".join(found)


def _section(name: str, model: dict[str, Any]) -> list[str]:
    lines = [f"## {name}", ""]
    if model.get("description"):
        lines += [" ".join(model["description"].split()), ""]
    lines += ["| field | type | required / default | allowed |", "|---|---|---|---|"]
    required = set(model.get("required", []))
    for field, spec in model.get("properties", {}).items():
        need = "required" if field in required else f"default `{json.dumps(spec.get('default'))}`"
        if "x-required" in spec:  # optional in the schema, required by a rule plan checks
            need = f"required {spec['x-required']}, else {need}"
        if "x-default" in spec:  # what an absent value means, where null says nothing
            need = f"default: {spec['x-default']}"
        lines.append(f"| `{field}` | {_type(spec)} | {need} | {_allowed(spec)} |")
    return [*lines, ""]


def reference_markdown() -> str:
    """The field reference page: one section per part of a policy, from :func:`json_schema`."""
    schema = json_schema()
    lines = [
        "# Release policy reference",
        "",
        "Generated from the policy schema (`privrelease policy schema`); do not edit by hand:",
        "`python -m privrelease.policies.reference` rewrites it and `docs/policy.schema.json`.",
        "Ranges are checked with a message naming the field; rules across fields (a column",
        "must be declared, a mean needs `dataset.rows`, ...) are checked by `privrelease plan`.",
        "",
        *_section("Policy", schema),
    ]
    for name, model in sorted(schema["$defs"].items()):
        lines += _section(name, model)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # pragma: no cover - rewrites the two generated files
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (root / SCHEMA_FILE).parent.mkdir(exist_ok=True)
    (root / SCHEMA_FILE).write_text(schema_text(), encoding="utf-8")
    (root / REFERENCE_FILE).write_text(reference_markdown(), encoding="utf-8")
