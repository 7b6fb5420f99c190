"""Tests of the release-policy schema, the YAML loader and the canonical hash."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from privrelease.errors import UserError
from privrelease.mechanisms.kinds.identifiable_statistic import IdentifiableStatisticMechanism
from privrelease.mechanisms.kinds.sdgs import SdgsMechanism
from privrelease.mechanisms.schemes import (
    Bins,
    Keep,
    Suppress,
    TopBottomCoding,
    ValueMap,
)
from privrelease.policies import (
    HierarchyScheme,
    LoadedPolicy,
    Policy,
    canonical_json,
    load_policy,
    load_policy_text,
    policy_hash,
    read_hierarchy,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "policies" / "examples"
ADULT_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("adult-*.yaml"))

# A small policy used by most tests; line numbers below refer to this text.
BASE = """\
name: test-policy
version: "1"
dataset:
  path: data.csv
  rows: 1000
  columns:
    age: {type: integer}
    sex: {type: string, values: [Male, Female]}
    hours: {type: float}
    job: {type: string, values: [a, b, c, d, e]}
generalization:
  age: {hierarchy: age.csv, level: 1}
  sex: keep
  hours: {bins: [0, 20, 40, 100], labels: [low, mid, high]}
mechanisms:
  - name: microdata
    type: sdgs
    columns: [age, sex]
    beta: 0.1
    k: 20
    epsilon: 1.0
targets:
  accounting: probabilistic
  delta: 1.0e-9
"""

AGE_HIERARCHY = "".join(f"{a};{a // 10 * 10}-{a // 10 * 10 + 9};*\n" for a in range(100))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A policy folder holding the age hierarchy the BASE policy names."""
    (tmp_path / "age.csv").write_text(AGE_HIERARCHY)
    return tmp_path


def load(text: str, folder: Path) -> LoadedPolicy:
    return load_policy_text(text, folder, source="p.yaml")


def edit(text: str, *replacements: tuple[str, str]) -> str:
    for old, new in replacements:
        assert text.count(old) == 1, f"{old!r} must occur once in the policy"
        text = text.replace(old, new)
    return text


def error_of(text: str, folder: Path) -> str:
    with pytest.raises(UserError) as info:
        load(text, folder)
    return str(info.value)


def assert_mentions(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize("name", ADULT_EXAMPLES)
def test_adult_example_loads(adult_dir: Path, name: str) -> None:
    loaded = load_policy(EXAMPLES / name)
    assert loaded.dataset_path == (adult_dir / "adult.csv").resolve()
    assert loaded.sha256 == policy_hash(loaded)
    for column, rows in loaded.hierarchies.items():
        assert all(row[-1] == "*" for row in rows), column
    for mechanism in loaded.policy.mechanisms:
        for ref in mechanism.column_refs():
            assert ref.column in loaded.policy.dataset.columns
            if ref.needs_scheme:
                candidates = mechanism.candidates or (None,)
                for candidate in candidates:
                    assert loaded.scheme(ref.column, candidate) is not None


def test_examples_cover_every_mechanism() -> None:
    assert len(ADULT_EXAMPLES) >= 6
    kinds: set[str] = set()
    selects = 0
    for path in EXAMPLES.glob("*.yaml"):
        document = yaml.safe_load(path.read_text())
        kinds.update(m["type"] for m in document["mechanisms"])
        selects += sum("select_scheme" in m for m in document["mechanisms"])
        if path.name.startswith("adult-"):
            assert document["dataset"]["path"] == "../../../shared/data/adult/adult.csv"
    assert kinds == {
        "sdgs",
        "histogram",
        "identifiable_statistic",
        "splu_gen",
        "noisy_counts",
        "noisy_sums",
        "noisy_tables",
    }
    assert selects >= 1


def test_demo_example_needs_no_external_file(tmp_path: Path) -> None:
    text = (EXAMPLES / "demo.yaml").read_text()
    loaded = load_policy_text(text, tmp_path)
    assert loaded.hierarchies == {}
    assert loaded.dataset_path == (tmp_path / "demo-census.csv").resolve()
    columns = loaded.policy.dataset.columns
    assert list(columns) == [
        "age",
        "sex",
        "race",
        "marital-status",
        "education",
        "occupation",
        "hours-per-week",
        "salary-class",
    ]
    assert columns["age"].type == columns["hours-per-week"].type == "integer"
    schemes = loaded.schemes(loaded.policy.generalization)
    assert schemes["sex"] == Keep()
    assert isinstance(schemes["age"], Bins) and schemes["age"].edges[0] == 17
    # Only DP mechanisms: they compose and charge the lifetime budget (SPLU-Gen is not DP).
    assert {m.type for m in loaded.policy.mechanisms} == {
        "sdgs",
        "histogram",
        "identifiable_statistic",
    }
    # The same policy loaded from its file has the same hash (base_dir is not hashed).
    assert load_policy(EXAMPLES / "demo.yaml").sha256 == loaded.sha256


def test_adult_age_hierarchy_level_1(adult_dir: Path) -> None:
    """ARX's age labels are off by one (SOURCE.md): {36..40} is "35-39", 20 is "15-19"."""
    loaded = load_policy(EXAMPLES / "adult-histogram.yaml")
    scheme = loaded.scheme("age")
    assert isinstance(scheme, ValueMap) and scheme.default is None
    mapping = dict(scheme.mapping)
    assert len(mapping) == 100
    assert mapping["39"] == mapping["40"] == mapping["36"] == "35-39"
    assert mapping["35"] == "30-34"
    assert mapping["20"] == "15-19" and mapping["90"] == "85-89"
    rows = read_hierarchy(adult_dir / "adult_hierarchy_age.csv")
    assert HierarchyScheme(hierarchy="x", level=0).to_scheme(rows).mapping[38] == (
        "39",
        "39",
    )
    assert set(dict(HierarchyScheme(hierarchy="x", level=4).to_scheme(rows).mapping).values()) == {"*"}


# --------------------------------------------------------------------------- schema and compilation


def test_scheme_forms_compile(folder: Path) -> None:
    text = edit(
        BASE,
        (
            "  sex: keep\n",
            "  sex: {map: {Male: M, Female: F}, default: X}\n  job: suppress\n",
        ),
    )
    text = text.replace("generalization:\n", "generalization:\n  gain: {top: 100, bottom: 0}\n")
    text = text.replace("    job:", "    gain: {type: integer}\n    job:")
    loaded = load(text, folder)
    assert loaded.scheme("sex") == ValueMap(mapping=(("Male", "M"), ("Female", "F")), default="X")
    assert loaded.scheme("job") == Suppress()
    assert loaded.scheme("gain") == TopBottomCoding(lower=0.0, upper=100.0)
    assert loaded.scheme("hours") == Bins(edges=(0.0, 20.0, 40.0, 100.0), labels=("low", "mid", "high"))
    assert dict(loaded.scheme("age").mapping)["42"] == "40-49"


def test_defaults_and_types(folder: Path) -> None:
    policy = load(BASE, folder).policy
    assert policy.dataset.format == "csv"
    assert policy.dataset.csv is not None and policy.dataset.csv.delimiter is None
    assert policy.dataset.missing == "reject" and policy.dataset.missing_values == (
        "",
        "?",
    )
    assert policy.targets.max_epsilon is None
    mechanism = policy.mechanism("microdata")
    assert isinstance(mechanism, SdgsMechanism) and mechanism.delta_reason() is not None
    with pytest.raises(ValidationError):
        mechanism.k = 5  # frozen
    parquet = load(edit(BASE, ("path: data.csv", "path: data.parquet")), folder).policy
    assert parquet.dataset.format == "parquet" and parquet.dataset.csv is None


def test_yaml_scalars_stay_text_where_text_is_meant(folder: Path) -> None:
    text = edit(
        BASE,
        ('version: "1"', "version: 1.10"),
        ("  sex: keep\n", "  sex: {map: {Male: NO, Female: 01}}\n"),
        ("delta: 1.0e-9", "delta: 1e-9"),
    )
    policy = load(text, folder).policy
    assert policy.version == "1.10"
    assert policy.generalization["sex"].map == {"Male": "NO", "Female": "01"}
    assert policy.targets.delta == 1e-9


MORE_MECHANISMS = """\
  - {name: counts, type: histogram, columns: [sex], k: 5}
  - {name: mean-age, type: identifiable_statistic, query: mean, column: age, lower: 17, upper: 90, rho: 0.1}
  - {name: jobs, type: identifiable_statistic, query: count, by: [sex], rho: 0.6}
targets:"""


def test_statistic_and_histogram_defaults(folder: Path) -> None:
    policy = load(edit(BASE, ("targets:", MORE_MECHANISMS)), folder).policy
    counts = policy.mechanism("counts")
    assert counts.beta == 1.0 and counts.epsilon is None and counts.delta_reason() is None
    mean = policy.mechanism("mean-age")
    assert isinstance(mean, IdentifiableStatisticMechanism) and mean.by == ()


def test_policy_model_validate_reports_field_path() -> None:
    document = yaml.safe_load(BASE.replace("delta: 1.0e-9", "max_epsilon: 1.0"))
    document["generalization"]["age"] = "keep"
    with pytest.raises(ValidationError) as info:
        Policy.model_validate(document)
    assert "targets.delta" in str(info.value)


# --------------------------------------------------------------------------- canonical hash


REFORMATTED = """\
# the same policy, written differently
targets: {delta: 1e-9, accounting: "probabilistic"}   # flow style, 1e-9
mechanisms:
- epsilon: 1            # an integer where a float is meant
  k: 20
  beta: 1.0e-1
  columns:
  - age
  - sex
  type: 'sdgs'
  name: "microdata"
generalization:
  hours:
    labels: ["low", mid, 'high']
    bins: [0.0, 20, 4.0e1, 100]
  sex: "keep"
  age:
    level: 1
    hierarchy: ./age.csv
dataset:
  columns:
    job: {values: [a, b, c, d, e], type: string}
    hours: {type: float}
    sex: {type: string, values: ["Male", "Female"]}
    age: {type: integer}
  csv: {}
  missing_values: ["", "?"]
  rows: 1000
  path: "data.csv"
version: 1
name: 'test-policy'
"""


def test_hash_ignores_layout_comments_order_quoting(folder: Path) -> None:
    base = load(BASE, folder)
    other = load(REFORMATTED, folder)
    assert canonical_json(other) == canonical_json(base)
    assert other.sha256 == base.sha256 == policy_hash(base)
    document = json.loads(canonical_json(base))
    assert canonical_json(base) == json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert document["policy"]["generalization"]["age"]["hierarchy"].startswith("sha256:")
    assert document["policy"]["mechanisms"][0]["beta"] == 0.1


def test_canonical_yaml_reads_back_to_the_same_policy(folder: Path) -> None:
    """``policy show``'s YAML: the schema's field order, unset optional fields left out, and
    loading it again gives the same canonical JSON (hash); a hierarchy shows its content hash."""
    from privrelease.policies.canonical import canonical_yaml

    demo = load_policy(EXAMPLES / "demo.yaml")
    text = canonical_yaml(canonical_json(demo))
    assert list(yaml.safe_load(text)) == [f for f in Policy.model_fields if f not in ("approval", "engine")]
    assert "null" not in text and "  id: demo-census\n" in text
    again = load_policy_text(text, EXAMPLES)
    assert canonical_json(again) == canonical_json(demo) and again.sha256 == demo.sha256

    base = canonical_yaml(canonical_json(load(BASE, folder)))
    assert "age: {type: hierarchy, hierarchy: 'sha256:" in base
    (mechanism,) = yaml.safe_load(base)["mechanisms"]
    assert list(mechanism)[:5] == ["name", "columns", "k", "beta", "epsilon"]
    plain = load(edit(BASE, ("  age: {hierarchy: age.csv, level: 1}\n", "  age: keep\n")), folder)
    assert load_policy_text(canonical_yaml(canonical_json(plain)), folder).sha256 == plain.sha256


@pytest.mark.parametrize(
    "old, new",
    [
        ("k: 20", "k: 21"),
        ("beta: 0.1", "beta: 0.2"),
        ("level: 1", "level: 0"),
        ("labels: [low, mid, high]", "labels: [low, mid, top]"),
        ("name: microdata", "name: rows"),
        ("delta: 1.0e-9", "delta: 1.0e-8"),
        ("path: data.csv", "path: other.csv"),
        ("  accounting: probabilistic\n", "  accounting: approximate\n"),
    ],
)
def test_hash_changes_with_any_value(folder: Path, old: str, new: str) -> None:
    assert load(edit(BASE, (old, new)), folder).sha256 != load(BASE, folder).sha256


def test_hash_follows_hierarchy_content_not_its_path_or_format(folder: Path) -> None:
    before = load(BASE, folder).sha256
    moved = folder / "sub" / "ages.csv"
    moved.parent.mkdir()
    moved.write_bytes(b"\xef\xbb\xbf" + AGE_HIERARCHY.replace("\n", "\r\n").encode() + b"\r\n")
    assert load(edit(BASE, ("hierarchy: age.csv", "hierarchy: sub/ages.csv")), folder).sha256 == before
    (folder / "age.csv").write_text(AGE_HIERARCHY.replace("42;40-49;*", "42;40-45;*"))
    assert load(BASE, folder).sha256 != before


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flow=st.booleans())
def test_hash_invariant_under_key_permutation(tmp_path_factory: pytest.TempPathFactory, seed: int, flow: bool) -> None:
    folder = tmp_path_factory.mktemp("perm")
    (folder / "age.csv").write_text(AGE_HIERARCHY)
    shuffle = random.Random(seed).shuffle

    def permute(value: object) -> object:
        if isinstance(value, dict):
            items = list(value.items())
            shuffle(items)
            return {k: permute(v) for k, v in items}
        if isinstance(value, list):
            return [permute(v) for v in value]
        return value

    text = yaml.safe_dump(permute(yaml.safe_load(BASE)), sort_keys=False, default_flow_style=flow)
    assert load(text, folder).sha256 == load(BASE, folder).sha256


# --------------------------------------------------------------------------- bad input


BAD = [
    # (id, replacements, field path, line, bad value, allowed)
    ("beta>1", [("beta: 0.1", "beta: 1.2")], "mechanisms[0].beta", 19, "1.2", "[0.0001, 1]"),
    ("beta=0", [("beta: 0.1", "beta: 0")], "mechanisms[0].beta", 19, "got 0", "[0.0001, 1]"),
    ("k float", [("k: 20", "k: 2.5")], "mechanisms[0].k", 20, "2.5", "integer in [1, 100000]"),
    ("k zero", [("k: 20", "k: 0")], "mechanisms[0].k", 20, "got 0", "integer in [1, 100000]"),
    ("k bool", [("k: 20", "k: true")], "mechanisms[0].k", 20, "true", "integer in [1, 100000]"),
    (
        "epsilon nan",
        [("epsilon: 1.0", "epsilon: .nan")],
        "mechanisms[0].epsilon",
        21,
        "nan",
        "in [0, 100]",
    ),
    (
        "bins inf",
        [("bins: [0, 20, 40, 100]", "bins: [0, .inf]")],
        "generalization.hours.bins[1]",
        14,
        "inf",
        "finite",
    ),
    (
        "epsilon<0",
        [("epsilon: 1.0", "epsilon: -1")],
        "mechanisms[0].epsilon",
        21,
        "-1",
        "in [0, 100]",
    ),
    (
        "epsilon missing",
        [("    epsilon: 1.0\n", "")],
        "mechanisms[0].epsilon",
        16,
        "beta is 0.1",
        "required",
    ),
    (
        "unknown type",
        [("type: sdgs", "type: sdg")],
        "mechanisms[0].type",
        17,
        "'sdg'",
        "histogram",
    ),
    (
        "unknown field",
        [("k: 20", "k: 20\n    bta: 3")],
        "mechanisms[0].bta",
        21,
        "'bta'",
        "beta",
    ),
    (
        "missing k",
        [("    k: 20\n", "")],
        "mechanisms[0].k",
        16,
        "k is required",
        "integer in [1, 100000]",
    ),
    (
        "delta=0",
        [("delta: 1.0e-9", "delta: 0")],
        "targets.delta",
        24,
        "got 0",
        "(0, 1)",
    ),
    (
        "delta missing",
        [("  delta: 1.0e-9\n", "")],
        "targets.delta",
        22,
        "beta 0.1",
        "(0, 1)",
    ),
    ("rows=0", [("rows: 1000", "rows: 0")], "dataset.rows", 5, "got 0", "integer in [1, 1e15]"),
    (
        "format",
        [("  rows: 1000\n", "  rows: 1000\n  format: xlsx\n")],
        "dataset.format",
        6,
        "'xlsx'",
        "parquet",
    ),
    (
        "missing mode",
        [("  rows: 1000\n", "  rows: 1000\n  missing: skip\n")],
        "dataset.missing",
        6,
        "'skip'",
        "drop",
    ),
    (
        "column type",
        [("hours: {type: float}", "hours: {type: double}")],
        "dataset.columns.hours.type",
        9,
        "'double'",
        "float",
    ),
    (
        "unsorted bins",
        [("bins: [0, 20, 40, 100]", "bins: [0, 40, 20, 100]")],
        "generalization.hours.bins",
        14,
        "[0, 40, 20, 100]",
        "strictly increasing",
    ),
    (
        "overlapping bins",
        [("bins: [0, 20, 40, 100]", "bins: [0, 20, 20, 100]")],
        "generalization.hours.bins",
        14,
        "[20, 20)",
        "strictly increasing",
    ),
    (
        "one edge",
        [("bins: [0, 20, 40, 100]", "bins: [0]")],
        "generalization.hours.bins",
        14,
        "[0]",
        "at least two",
    ),
    (
        "labels count",
        [("labels: [low, mid, high]", "labels: [low, mid]")],
        "generalization.hours.labels",
        14,
        "['low', 'mid']",
        "one label per bin",
    ),
    (
        "bins on text",
        [("sex: keep", "sex: {bins: [0, 1]}")],
        "generalization.sex",
        13,
        "type string",
        "integer or float",
    ),
    (
        "bad scheme",
        [("sex: keep", "sex: kep")],
        "generalization.sex",
        13,
        "'kep'",
        "keep, suppress",
    ),
    (
        "level<0",
        [("level: 1", "level: -1")],
        "generalization.age.level",
        12,
        "-1",
        "integer in [0, 1000]",
    ),
    (
        "scheme of undeclared column",
        [("sex: keep", "sex: keep\n  hours2: {top: 1}")],
        "generalization.hours2",
        14,
        "'hours2'",
        "not declared in dataset.columns",
    ),
    (
        "undeclared column",
        [("columns: [age, sex]", "columns: [age, sexx]")],
        "mechanisms[0].columns[1]",
        18,
        "'sexx'",
        "declared: age, sex, hours, job",
    ),
    (
        "no scheme",
        [("columns: [age, sex]", "columns: [age, job]")],
        "mechanisms[0].columns[1]",
        18,
        "'job'",
        "add generalization.job",
    ),
    (
        "nested choice",  # the tags of both unions (mechanism type, noise distribution) are not in the path
        [
            (
                "targets:",
                "  - {name: table, type: noisy_counts, columns: [sex], noise: {distribution: gaussian, sigma: -1}}\n"
                "targets:",
            )
        ],
        "mechanisms[1].noise.sigma",
        22,
        "got -1",
        "[0.01, 1e+06]",
    ),
    (
        "duplicate name",
        [
            (
                "targets:",
                "  - {name: microdata, type: histogram, columns: [sex], k: 5}\ntargets:",
            )
        ],
        "mechanisms[1].name",
        22,
        "'microdata'",
        "unique",
    ),
    (
        "lower>=upper",
        [
            (
                "targets:",
                "  - {name: s, type: identifiable_statistic, query: sum, column: age, lower: 9, upper: 9, rho: 0.1}\ntargets:",
            )
        ],
        "mechanisms[1].upper",
        22,
        "lower 9, upper 9",
        "lower must be < upper",
    ),
    (
        "rho=1",
        [
            (
                "targets:",
                "  - {name: s, type: identifiable_statistic, query: sum, column: age, lower: 0, upper: 9, rho: 1}\ntargets:",
            )
        ],
        "mechanisms[1].rho",
        22,
        "got 1",
        "(0, 1)",
    ),
    (
        "mean without rows",
        [
            ("  rows: 1000\n", ""),
            (
                "targets:",
                "  - {name: s, type: identifiable_statistic, query: mean, column: age, lower: 0, upper: 9, rho: 0.1}\ntargets:",
            ),
        ],
        "mechanisms[1].query",
        21,
        "a mean",
        "dataset.rows",
    ),
    (
        "gamma=1",
        [
            (
                "targets:",
                "  - {name: s, type: splu_gen, gamma: 1, sensitive: [job]}\ntargets:",
            )
        ],
        "mechanisms[1].gamma",
        22,
        "got 1",
        "integer in [2, 100000]",
    ),
    (
        "undeclared sensitive",
        [
            (
                "targets:",
                "  - {name: s, type: splu_gen, gamma: 2, sensitive: [disease]}\ntargets:",
            )
        ],
        "mechanisms[1].sensitive[0]",
        22,
        "'disease'",
        "declared: age",
    ),
    (
        "unknown candidate",
        [
            (
                "    epsilon: 1.0\n",
                "    epsilon: 1.0\n    select_scheme: {epsilon: 0.1, candidates: [a, b]}\n",
            )
        ],
        "mechanisms[0].select_scheme.candidates[0]",
        22,
        "'a'",
        "candidate_schemes",
    ),
    (
        "select epsilon=0",
        [
            (
                "    epsilon: 1.0\n",
                "    epsilon: 1.0\n    select_scheme: {epsilon: 0, candidates: [a, b]}\n",
            )
        ],
        "mechanisms[0].select_scheme.epsilon",
        22,
        "got 0",
        "in (0, 100]",
    ),
    (
        "extra top-level",
        [("name: test-policy", "name: test-policy\nnmae: x")],
        "nmae",
        2,
        "'nmae'",
        "allowed: name, version",
    ),
]


@pytest.mark.parametrize(
    "replacements, path, line, value, allowed",
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_bad_policy_message(
    folder: Path,
    replacements: list[tuple[str, str]],
    path: str,
    line: int,
    value: str,
    allowed: str,
) -> None:
    message = error_of(edit(BASE, *replacements), folder)
    assert_mentions(message, "p.yaml", f"line {line}, {path}:", value, allowed)


@pytest.mark.parametrize(
    "first, second, expected",
    [
        ("a/b", "a_b", "'a/b' names its output file"),
        ("../escape", "fine", "'../escape' names its output file"),
        ("Counts", "counts", "'counts' is already used by mechanisms[0] (names are compared ignoring case"),
        ("x" * 65, "y", "at most 64 characters"),
    ],
)
def test_mechanism_names_are_safe_unique_file_names(folder: Path, first: str, second: str, expected: str) -> None:
    """Each mechanism's name is its output's file name: two names must never give one file."""
    block = "    beta: 0.1\n    k: 20\n    epsilon: 1.0\n"
    text = edit(
        BASE,
        (
            "  - name: microdata\n    type: sdgs\n    columns: [age, sex]\n" + block,
            f"  - name: {first!r}\n    type: sdgs\n    columns: [age, sex]\n"
            + block
            + f"  - name: {second!r}\n    type: sdgs\n    columns: [age]\n"
            + block,
        ),
    )
    assert_mentions(error_of(text, folder), "mechanisms[", ".name:", expected)


def test_every_problem_is_listed_at_once(folder: Path) -> None:
    """Three mistakes: three lines, in line order, each with file, line, path, value and rule."""
    text = edit(BASE, ('version: "1"', 'version: "1"\nnmae: x'), ("k: 20", "k: 0"), ("beta: 0.1", "beta: 2"))
    message = error_of(text, folder)
    first, *lines = message.splitlines()
    assert first == "3 problems in this policy:"
    assert [line.split(": ", 1)[0] for line in lines] == [
        "p.yaml, line 3, nmae",
        "p.yaml, line 20, mechanisms[0].beta",
        "p.yaml, line 21, mechanisms[0].k",
    ]
    assert "got 2" in lines[1] and "in [0.0001, 1]" in lines[1] and "got 0" in lines[2]


def test_top_not_above_bottom(folder: Path) -> None:
    text = edit(
        BASE,
        (
            "    hours: {type: float}\n",
            "    hours: {type: float}\n    gain: {type: float}\n",
        ),
    )
    text = edit(text, ("  sex: keep\n", "  sex: keep\n  gain: {top: 1, bottom: 5}\n"))
    assert_mentions(
        error_of(text, folder),
        "line 15, generalization.gain.bottom:",
        "bottom 5, top 1",
        "bottom must be < top",
    )


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="policy file not found: .*nowhere.yaml"):
        load_policy(tmp_path / "nowhere.yaml")


@pytest.mark.parametrize(
    "text, line, expected",
    [
        ("name: [a\nversion: 1\n", 2, "invalid YAML"),
        ("name: a\n\tversion: 1\n", 2, "invalid YAML"),
        ("name: a\nname: b\n", 2, "duplicate key 'name' (first at line 1)"),
        ("- a\n- b\n", 1, "must be a YAML mapping"),
    ],
)
def test_invalid_yaml(tmp_path: Path, text: str, line: int, expected: str) -> None:
    assert_mentions(error_of(text, tmp_path), f"p.yaml, line {line}", expected)


def test_empty_policy(tmp_path: Path) -> None:
    assert_mentions(error_of("# nothing\n", tmp_path), "p.yaml", "empty")


def test_duplicate_key_deep_in_policy(folder: Path) -> None:
    text = edit(BASE, ("    k: 20\n", "    k: 20\n    k: 30\n"))
    assert_mentions(
        error_of(text, folder),
        "line 21, mechanisms[0].k:",
        "duplicate key 'k' (first at line 20)",
    )


def test_file_uri_and_absolute_paths(folder: Path) -> None:
    uri = (folder / "data.csv").as_uri()
    loaded = load(
        edit(
            BASE,
            ("path: data.csv", f"path: {uri}"),
            ("hierarchy: age.csv", f"hierarchy: {folder / 'age.csv'}"),
        ),
        folder,
    )
    assert loaded.dataset_path == folder / "data.csv"
    assert "age" in loaded.hierarchies
    message = error_of(edit(BASE, ("path: data.csv", "path: s3://bucket/data.csv")), folder)
    assert_mentions(message, "line 4, dataset.path:", "s3://bucket/data.csv", "file:// URI")


def test_load_policy_resolves_against_its_folder(folder: Path) -> None:
    (folder / "policy.yaml").write_text(BASE)
    loaded = load_policy(folder / "policy.yaml")
    assert loaded.path == folder / "policy.yaml" and loaded.base_dir == folder
    assert loaded.dataset_path == folder / "data.csv"
    with pytest.raises(UserError, match=r"policy.yaml, line 19, mechanisms\[0\]\.beta"):
        (folder / "policy.yaml").write_text(edit(BASE, ("beta: 0.1", "beta: 2")))
        load_policy(folder / "policy.yaml")


# --------------------------------------------------------------------------- hierarchy files


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "hierarchy file not found"),
        ("", "is empty"),
        ("1;a;*\n2;a;*\n3;*\n", "ragged: row 3 has 2 columns but row 1 has 3"),
        ("1;a;*\n2;b;*\n1;c;*\n", "leaf '1' appears in rows 1 and 3"),
        ("1;a;*\n2;a;top\n", "row 2 ends with 'top'; the last column must be '*'"),
        ("1\n2\n", "has one column"),
    ],
    ids=["missing", "empty", "ragged", "duplicate leaf", "last not star", "one column"],
)
def test_bad_hierarchy_file(tmp_path: Path, content: str | None, expected: str) -> None:
    if content is not None:
        (tmp_path / "age.csv").write_text(content)
    message = error_of(BASE, tmp_path)
    assert_mentions(
        message,
        "p.yaml, line 12, generalization.age.hierarchy:",
        str(tmp_path / "age.csv"),
        expected,
    )


def test_level_beyond_hierarchy_depth(folder: Path) -> None:
    message = error_of(edit(BASE, ("level: 1", "level: 3")), folder)
    assert_mentions(message, "line 12, generalization.age.level:", "got 3", "between 0 and 2")


def test_hierarchy_must_cover_declared_values(folder: Path) -> None:
    text = edit(BASE, ("age: {type: integer}", "age: {type: integer, values: [5, 150]}"))
    assert_mentions(
        error_of(text, folder),
        "line 12, generalization.age.hierarchy:",
        "[150]",
        "not leaves",
    )


def test_one_hierarchy_file_per_column(folder: Path) -> None:
    (folder / "age2.csv").write_text(AGE_HIERARCHY)
    text = BASE + "candidate_schemes:\n  other:\n    age: {hierarchy: age2.csv, level: 2}\n"
    assert_mentions(
        error_of(text, folder),
        "line 27, candidate_schemes.other.age.hierarchy:",
        "one hierarchy file per column",
    )


def test_read_hierarchy_skips_blank_lines_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_bytes(b"\xef\xbb\xbfa;x;*\r\n\r\nb;x;*")
    assert read_hierarchy(path) == (("a", "x", "*"), ("b", "x", "*"))


def test_checking_a_policy_loads_no_mechanism_engine() -> None:
    """Loading and checking every example policy imports none of the engines a run needs
    (scipy, Arrow's compute, the mechanisms' implementations) nor the audit database: a refusal
    for a bad policy or data path answers at plan speed (bench/cli.py)."""
    examples = sorted((Path(__file__).resolve().parents[1] / "policies" / "examples").glob("*.yaml"))
    engines = [
        "scipy",
        "pyarrow.compute",
        "privrelease.mechanisms.histogram",
        "privrelease.mechanisms.sdgs",
        "sqlalchemy",
    ]
    code = (
        "import json, sys\n"
        "from privrelease.policies import load_policy\n"
        f"for path in {[str(p) for p in examples]!r}:\n"
        "    load_policy(path)\n"
        f"print(json.dumps(sorted(set({engines!r}) & set(sys.modules))))\n"
    )
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not shared.is_dir():
        pytest.skip(f"the Adult examples read their hierarchies from {shared}, absent here")
    env = {**os.environ, "PRIVRELEASE_DATA_ROOTS": str(shared)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout) == []


def test_every_scheme_states_itself_in_words() -> None:
    """Reports and release.json describe a column's scheme by asking the scheme (one class per
    scheme type: a new one brings its own words)."""
    from privrelease.policies import schema

    forms = {
        "keep": (schema.KeepScheme(), "kept as is"),
        "suppress": (schema.SuppressScheme(), "suppressed (every value becomes *)"),
        "hierarchy": (
            schema.HierarchyScheme(hierarchy="h/adult_hierarchy_age.csv", level=2),
            "hierarchy adult_hierarchy_age.csv, level 2",
        ),
        "bins": (
            schema.BinsScheme(bins=(0, 30, 60.5), labels=("young", "old")),
            "intervals with edges 0, 30, 60.5 labelled young, old",
        ),
        "top_bottom": (
            schema.TopBottomScheme(top=90, bottom=17),
            "top/bottom coding: values ≤ 17 coded as one; values ≥ 90 coded as one",
        ),
        "map": (
            schema.MapScheme(map={"a": "x", "b": "y", "c": "x"}, default="z"),
            "value map of 3 values onto x, y; every other value → z",
        ),
    }
    assert set(forms) == set(schema.SCHEME_TYPES)
    for scheme, words in forms.values():
        assert scheme.in_words() == words
    assert schema.TopBottomScheme(top=90).in_words() == "top/bottom coding: values ≥ 90 coded as one"
