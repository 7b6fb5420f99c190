"""The release policy: pydantic v2 models of what a policy YAML may say, with its validation rules.

Every model is frozen and forbids unknown fields. Parameters keep the papers' names: ``beta``
(sampling probability) and ``k`` (minimum cell size) of (k, beta)-SDGS (Li, Qardaji, Su,
Algorithm 4), ``epsilon``/``delta`` of (eps, delta)-DP, ``rho`` of rho-differential
identifiability (Lee & Clifton), ``gamma`` (decoy group size) of SPLU-Gen (Fu et al.).

A validation failure raises :class:`FieldError` carrying the location (relative to the model that
raised it) and a message that names the value and what is allowed, so the loader can point at the
YAML line. The rules that need files (hierarchy CSVs) live in :mod:`.loader`.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator, Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    StrictBool,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)

from privrelease import identity
from privrelease.mechanisms import confidence
from privrelease.mechanisms.guarantees import Budget
from privrelease.mechanisms.kinds import MechanismKind, all_kinds
from privrelease.mechanisms.schemes import (
    Bins,
    ColumnScheme,
    Keep,
    Suppress,
    TopBottomCoding,
    ValueMap,
)
from privrelease.policies.fields import (
    Alpha,
    ColumnRef,
    Count,
    Delta,
    FieldError,
    Hierarchy,
    Issue,
    Level,
    Loc,
    Model,
    Name,
    Number,
    PositiveEpsilon,
    RelativeError,
    Rho,
    Rows,
    SpluEpsilon,
    Text,
    _number_as_text,
    at_least,
    checked,
    num,
    show,
)

# --------------------------------------------------------------------------- dataset


class CsvOptions(Model):
    """How to read a CSV file. ``delimiter`` None: sniffed from the file."""

    delimiter: Text | None = None
    quote: Text = '"'
    header: StrictBool = True
    encoding: Text = "utf-8"

    @field_validator("delimiter", "quote")
    @classmethod
    def _one_character(cls, value: str | None, info: Any) -> str | None:
        if value is not None and (len(value) != 1 or value in "\r\n"):
            raise ValueError(f"{info.field_name} must be one character (not a newline); got {show(value)}")
        return value

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        try:
            return codecs.lookup(value).name
        except LookupError:
            raise ValueError(
                f"encoding must be a Python codec name such as utf-8 or latin-1; got {show(value)}"
            ) from None


ColumnType = Literal["string", "integer", "float"]


class ColumnSpec(Model):
    """A column the policy uses: its type and, optionally, its declared (public) domain."""

    type: ColumnType
    values: tuple[Any, ...] | None = None

    @field_validator("values")
    @classmethod
    def _values_match_type(cls, values: tuple[Any, ...] | None, info: Any) -> tuple[Any, ...] | None:
        if values is None:
            return None
        kind = info.data.get("type")
        if kind is None:
            return values
        if not values:
            raise ValueError(f"values must list at least one value; got {show(values)}")
        converted = tuple(_as_column_value(kind, i, v) for i, v in enumerate(values))
        seen: dict[Any, int] = {}
        for i, v in enumerate(converted):
            if v in seen:
                raise FieldError.at((i,), f"value {show(v)} is listed twice (at {seen[v]} and {i})")
            seen[v] = i
        return converted

    @property
    def numeric(self) -> bool:
        return self.type in ("integer", "float")


def _as_column_value(kind: str, index: int, value: Any) -> Any:
    """A declared value converted to the column's type, or a FieldError naming it."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise FieldError.at(
            (index,),
            f"a declared value must be text or a number; got {show(value)}",
        )
    if kind == "string":
        return _number_as_text(value)
    if kind == "integer" and isinstance(value, int):
        return value
    if kind == "float" and isinstance(value, (int, float)):
        return float(value)
    allowed = "an integer" if kind == "integer" else "a number"
    raise FieldError.at((index,), f"a value of a {kind} column must be {allowed}; got {show(value)}")


_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def _dataset_id(value: str) -> str:
    message = identity.problem(value)
    if message:
        raise ValueError(message)
    return value


DatasetId = Annotated[StrictStr, AfterValidator(_dataset_id)]


def _sha256_hex(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"sha256 must be the 64 lower-case hex digits of the file's sha256; got {show(value)}")
    return value


MAX_ROWS_PER_PERSON = 1000


class Person(Model):
    """Who one person is: ``column`` holds a person's identifier (never published); a person's
    rows beyond ``max_rows`` are dropped at random before any mechanism runs, so every guarantee
    is for one person with at most ``max_rows`` rows: noisy counts, sums and tables read them all
    (sensitivity ``max_rows``, times the bound for totals), the kinds whose papers assume one row
    per person (SDGS, histograms, SPLU-Gen, identifiable statistics) one random row of each person."""

    column: Name
    max_rows: Annotated[
        int,
        checked(
            "max_rows",
            f"an integer in [1, {MAX_ROWS_PER_PERSON}]",
            lambda v: 1 <= v <= MAX_ROWS_PER_PERSON,
            integer=True,
        ),
    ]


class Dataset(Model):
    """The input: who it is about (``id``: the population, which holds the lifetime budget),
    where it is, optionally exactly which file (``sha256``: the vintage; a run refuses any
    other content, and an approval binds it), how to read it, and the columns it uses.
    ``rows``: how many rows it has, or with a person column how many people (the one-row kinds
    read one row a person), as a public constant, never counted from the data: the denominator
    of an identifiable mean and the size SDGS's expected sample is planned from."""

    id: DatasetId | None = Field(
        None, json_schema_extra={"x-required": "when the release charges the lifetime budget (any DP mechanism)"}
    )
    path: Name
    sha256: Annotated[StrictStr, AfterValidator(_sha256_hex)] | None = None
    format: Literal["csv", "parquet"] = "csv"
    csv: CsvOptions | None = None
    rows: Rows | None = None
    missing: Literal["reject", "drop"] = "reject"
    missing_values: tuple[Text, ...] = ("", "?")
    columns: Annotated[dict[Name, ColumnSpec], at_least(1, "column")]
    person: Literal["row"] | Person | None = Field(
        None, json_schema_extra={"x-default": "each row is taken to be a different person"}
    )

    @property
    def size_unit(self) -> str:
        """What ``rows`` counts: ``people`` with a person column, else ``rows``."""
        return "people" if isinstance(self.person, Person) else "rows"

    @property
    def person_column(self) -> str | None:
        """The column naming each row's person (None: each row is a different person)."""
        return self.person.column if isinstance(self.person, Person) else None

    @property
    def rows_per_person(self) -> int:
        """The most rows one person may have in what the mechanisms read: 1 unless ``person``
        names a column (then its ``max_rows``)."""
        return self.person.max_rows if isinstance(self.person, Person) else 1

    def rows_read(self, spec: Any) -> int:
        """How many rows of each person mechanism ``spec`` reads: :attr:`rows_per_person` when
        its kind reads them all (``reads_max_rows``, with sensitivity that many), else 1 (its
        paper's one random row per person, :mod:`privrelease.mechanisms.persons`)."""
        return self.rows_per_person if spec.reads_max_rows else 1

    @model_validator(mode="before")
    @classmethod
    def _fill_format(cls, data: Any) -> Any:
        """``format`` defaults from the file suffix; a CSV gets default ``csv`` options."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "format" not in data and isinstance(data.get("path"), str):
            suffix = data["path"].lower().rsplit(".", 1)[-1]
            data["format"] = "parquet" if suffix in ("parquet", "pq") else "csv"
        if data.get("format") == "csv" and data.get("csv") is None:
            data["csv"] = {}
        return data

    @field_validator("path")
    @classmethod
    def _file_path_or_uri(cls, value: str) -> str:
        match = _URI.match(value)
        if match and match.group(1).lower() != "file":
            raise ValueError(f"path must be a file path or a file:// URI; got {show(value)}")
        return value

    @model_validator(mode="after")
    def _csv_options_only_for_csv(self) -> Dataset:
        if self.format == "parquet" and self.csv is not None:
            raise FieldError.at(
                ("csv",),
                "csv options apply to format csv only; this dataset is parquet",
            )
        return self


# --------------------------------------------------------------------------- generalization schemes


class _Scheme(Model):
    numeric: ClassVar[bool] = False
    """True for schemes that need an integer or float column (bins, top/bottom coding)."""

    @model_validator(mode="before")
    @classmethod
    def _from_word(cls, data: Any) -> Any:
        """The bare words ``keep`` and ``suppress`` stand for their scheme."""
        if isinstance(data, str) and data == cls.model_fields["type"].default:
            return {"type": data}
        return data

    def to_scheme(self, hierarchy: Hierarchy | None = None) -> ColumnScheme:
        """The compiled, data-independent scheme (``hierarchy``: the parsed rows, hierarchies only)."""
        raise NotImplementedError

    def in_words(self) -> str:
        """The scheme as a report states it."""
        raise NotImplementedError

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        """In the JSON Schema too, a scheme is its object form with ``type`` (the other keys
        tell the YAML forms apart), and ``keep`` / ``suppress`` may be the bare word."""
        json_schema = handler(core_schema)
        target = handler.resolve_ref_schema(json_schema)
        word = cls.model_fields["type"].default
        if word in ("keep", "suppress"):
            form = {**target, "required": ["type"]}
            target.clear()
            target.update(title=form.pop("title"), description=form.pop("description"), anyOf=[{"const": word}, form])
        return json_schema


class KeepScheme(_Scheme):
    """``keep``: publish the value as is."""

    type: Literal["keep"] = "keep"

    def to_scheme(self, hierarchy: Hierarchy | None = None) -> ColumnScheme:
        return Keep()

    def in_words(self) -> str:
        return "kept as is"


class SuppressScheme(_Scheme):
    """``suppress``: every value becomes ``*``."""

    type: Literal["suppress"] = "suppress"

    def to_scheme(self, hierarchy: Hierarchy | None = None) -> ColumnScheme:
        return Suppress()

    def in_words(self) -> str:
        return "suppressed (every value becomes *)"


class HierarchyScheme(_Scheme):
    """An ARX hierarchy CSV (``value;level1;...;*``) cut at ``level`` (0 = the value itself)."""

    type: Literal["hierarchy"] = "hierarchy"
    hierarchy: Name
    level: Level

    def to_scheme(self, hierarchy: Hierarchy | None = None) -> ColumnScheme:
        """``ValueMap(leaf -> row[level], default=None)``: a value that is no leaf is out of domain."""
        assert hierarchy is not None, "a hierarchy scheme compiles from the parsed hierarchy rows"
        assert self.level < len(hierarchy[0]), "the loader checks level against the depth"
        return ValueMap(mapping=tuple((row[0], row[self.level]) for row in hierarchy), default=None)

    def in_words(self) -> str:
        return f"hierarchy {PurePath(self.hierarchy).name}, level {self.level}"


class BinsScheme(_Scheme):
    """Interval bins ``[bins[i], bins[i+1])``, the last closed; ``labels`` one per bin."""

    type: Literal["bins"] = "bins"
    bins: tuple[Number, ...]
    labels: tuple[Text, ...] | None = None
    numeric: ClassVar[bool] = True

    @model_validator(mode="after")
    def _edges_increase(self) -> BinsScheme:
        edges = self.bins
        if len(edges) < 2:
            raise FieldError.at(("bins",), f"bins must list at least two edges; got {show(edges)}")
        for i in range(len(edges) - 1):
            lo, hi = edges[i], edges[i + 1]
            if hi == lo:
                problem = f"edge {num(lo)} is repeated (an empty bin [{num(lo)}, {num(hi)}))"
            elif hi < lo:
                problem = (
                    f"edge {num(lo)} is followed by the smaller edge {num(hi)}, so bin "
                    f"[{num(lo)}, {num(hi)}) is reversed and overlaps its neighbours"
                )
            else:
                continue
            raise FieldError.at(
                ("bins",),
                f"bins must be strictly increasing edges; got {show(edges)}: {problem}",
            )
        if self.labels is not None and len(self.labels) != len(edges) - 1:
            raise FieldError.at(
                ("labels",),
                f"labels must give one label per bin: {len(edges) - 1} bins from "
                f"{len(edges)} edges {show(edges)}; got {len(self.labels)} labels {show(self.labels)}",
            )
        return self

    def to_scheme(self, hierarchy: Hierarchy | None = None) -> ColumnScheme:
        return Bins(edges=self.bins, labels=self.labels)

    def in_words(self) -> str:
        labels = f" labelled {', '.join(self.labels)}" if self.labels else ""
        return f"intervals with edges {', '.join(f'{edge:g}' for edge in self.bins)}{labels}"


class TopBottomScheme(_Scheme):
    """Top/bottom coding: values >= ``top`` / <= ``bottom`` become one label each."""

    type: Literal["top_bottom"] = "top_bottom"
    top: Number | None = None
    bottom: Number | None = None
    numeric: ClassVar[bool] = True

    @model_validator(mode="after")
    def _bounds(self) -> TopBottomScheme:
        if self.top is None and self.bottom is None:
            raise FieldError.at(("top",), "top/bottom coding needs top, bottom or both; got neither")
        if self.top is not None and self.bottom is not None and not self.bottom < self.top:
            raise FieldError.at(
                ("bottom",),
                f"bottom must be < top; got bottom {num(self.bottom)}, top {num(self.top)}",
            )
        return self

    def to_scheme(self, hierarchy: Hierarchy | None = None) -> ColumnScheme:
        return TopBottomCoding(lower=self.bottom, upper=self.top)

    def in_words(self) -> str:
        bottom = [] if self.bottom is None else [f"values ≤ {self.bottom:g} coded as one"]
        top = [] if self.top is None else [f"values ≥ {self.top:g} coded as one"]
        return "top/bottom coding: " + "; ".join(bottom + top)


class MapScheme(_Scheme):
    """An explicit value map; ``default`` labels every other value (absent: others are errors)."""

    type: Literal["map"] = "map"
    map: Annotated[dict[Text, Text], at_least(1, "entry")]
    default: Text | None = None

    def to_scheme(self, hierarchy: Hierarchy | None = None) -> ColumnScheme:
        return ValueMap(mapping=tuple(self.map.items()), default=self.default)

    def in_words(self) -> str:
        default = f"; every other value → {self.default}" if self.default is not None else ""
        return f"value map of {len(self.map)} values onto {', '.join(sorted(set(self.map.values())))}{default}"


SCHEME_TYPES = ("keep", "suppress", "hierarchy", "bins", "top_bottom", "map")
_SCHEME_KEYS = (
    ("hierarchy", "hierarchy"),
    ("bins", "bins"),
    ("map", "map"),
    ("top", "top_bottom"),
)


def _scheme_type(value: Any) -> str | None:
    """Which scheme form a YAML value is: a bare word, an explicit ``type``, or its key."""
    if isinstance(value, _Scheme):
        return getattr(value, "type", None)
    if isinstance(value, str):
        return value if value in ("keep", "suppress") else None
    if isinstance(value, dict):
        if "type" in value:
            return value["type"] if value["type"] in SCHEME_TYPES else None
        for key, kind in (*_SCHEME_KEYS, ("bottom", "top_bottom")):
            if key in value:
                return kind
    return None


Scheme = Annotated[
    Annotated[KeepScheme, Tag("keep")]
    | Annotated[SuppressScheme, Tag("suppress")]
    | Annotated[HierarchyScheme, Tag("hierarchy")]
    | Annotated[BinsScheme, Tag("bins")]
    | Annotated[TopBottomScheme, Tag("top_bottom")]
    | Annotated[MapScheme, Tag("map")],
    Discriminator(
        _scheme_type,
        custom_error_type="scheme_form",
        custom_error_message=(
            "a generalization scheme must be keep, suppress, {hierarchy, level}, {bins, labels}, "
            "{top, bottom} or {map, default}"
        ),
    ),
]


# --------------------------------------------------------------------------- mechanisms


KINDS = all_kinds()
"""Every mechanism kind by its ``type`` (:mod:`privrelease.mechanisms.kinds`)."""
MECHANISM_TYPES = tuple(KINDS)
if TYPE_CHECKING:  # the union is built at run time from the kinds found; statically, their base
    Mechanism = MechanismKind
else:
    Mechanism = Annotated[Union[tuple(KINDS.values())], Field(discriminator="type")]  # noqa: UP007
"""A mechanism section of the policy: any kind, told apart by ``type``."""


# --------------------------------------------------------------------------- targets


class SpluPrivacyTarget(Model):
    """(eps, T_p, alpha) small-sum privacy (Fu et al., Definition 3 / Theorem 4): every sum of
    at most alpha is estimated with relative error >= epsilon with probability >= t_p."""

    epsilon: SpluEpsilon
    t_p: Annotated[float, checked("t_p", "in (0, 1)", lambda v: 0 < v < 1)]
    alpha: Alpha


class SpluUtilityTarget(Model):
    """(eps, T_E, T_f) large-sum utility (Fu et al., Definition 1, Lemma 1): the count of one
    sensitive value on its own, over all rows, if at least t_f, is estimated with relative error
    >= epsilon with probability at most t_e (counts that also condition on other columns have no
    such guarantee). The plan computes the smallest such T_f exactly (the paper's Lemma 1
    formula understates it) and checks it is at most t_f."""

    epsilon: SpluEpsilon
    t_e: Annotated[float, checked("t_e", "in (0, 1)", lambda v: 0 < v < 1)]
    t_f: Annotated[float, checked("t_f", "> 0", lambda v: v > 0)]


class LifetimeBudget(Model):
    """The dataset's lifetime (epsilon, delta) budget across all runs."""

    epsilon: PositiveEpsilon
    delta: Annotated[float, checked("delta", "in [0, 1)", lambda v: 0 <= v < 1)] = 0.0

    @property
    def budget(self) -> Budget:
        """As the ledger's (epsilon, delta) pair."""
        return Budget(self.epsilon, self.delta)


Confidence = Annotated[float, checked("confidence", confidence.ALLOWED, confidence.is_confidence)]


class AccuracyTarget(Model):
    """What one mechanism's published numbers must be worth, from the policy alone
    (:mod:`privrelease.mechanisms.accuracy`), with probability at least ``confidence``:
    SDGS microdata and histograms (``count``, ``relative_error``): a cell of ``count`` people
    is published and its estimate count/beta is within +-relative_error of it; identifiable
    statistics (``absolute_error``): each published value is within +-absolute_error of the
    exact statistic of the clamped values (a mean: their sum divided by the declared
    dataset.rows); noisy counts (``absolute_error``): each cell's
    published count is within +-absolute_error of its true count (cell by cell, not all cells
    at once: plan, the report and release.json state the whole table's wider half-width too);
    noisy sums (``absolute_error`` and ``statistic``: ``total`` or ``count``): each cell's
    published total (or count) is within +-absolute_error of its true one;
    noisy tables (``absolute_error``, optional ``table`` and ``cells``): the cells of ``table``
    (one of the mechanism's ``tables``; omitted: each table, on its own) are within
    +-absolute_error of their true counts, ``cells: all`` (default) every cell of that table at
    once, ``cells: each`` each cell on its own; with ``nonnegative``, of the unrounded estimate
    (the published integers differ by a rounding shift); ``statistic: total`` (default ``count``):
    of their totals of the ``total`` column, in its units."""

    mechanism: Name
    count: Count | None = None
    relative_error: RelativeError | None = None
    absolute_error: Annotated[float, checked("absolute_error", "> 0", lambda v: v > 0)] | None = None
    statistic: Name | None = None
    confidence: Confidence = 0.95
    table: tuple[Name, ...] | None = None
    cells: Literal["each", "all"] | None = None


class Targets(Model):
    """What the release must guarantee; checked before any data is read."""

    accounting: Literal["probabilistic", "approximate"] = "probabilistic"
    max_epsilon: Annotated[float, checked("max_epsilon", ">= 0", lambda v: v >= 0)] | None = None
    delta: Delta | None = None
    rho: Rho | None = None
    splu_privacy: SpluPrivacyTarget | None = None
    splu_utility: SpluUtilityTarget | None = None
    lifetime_budget: LifetimeBudget | None = None
    accuracy: tuple[AccuracyTarget, ...] = ()


# --------------------------------------------------------------------------- the policy


class ApprovalRule(Model):
    """Who must approve before a production run: ``approvers`` distinct people (by their
    ``--by`` name), and with ``independent`` none of them the operating-system user who runs it."""

    approvers: Annotated[int, checked("approvers", "an integer in [1, 10]", lambda v: 1 <= v <= 10, integer=True)] = 1
    independent: StrictBool = False


class EngineSection(Model):
    """Where a release's data work runs by default (``privrelease run --engine``,
    ``--dask-address`` and ``--workers`` override it): ``local`` (in the flow's process) or
    ``dask`` (the cluster at ``address``, or a local cluster of ``workers`` processes; about
    ``rows_per_partition`` rows, whole Parquet row groups or CSV lines, per task). The release and its
    guarantees are the same on either."""

    name: Literal["local", "dask"] = "local"
    address: Name | None = None
    workers: (
        Annotated[int, checked("workers", "an integer in [1, 1024]", lambda v: 1 <= v <= 1024, integer=True)] | None
    ) = None
    rows_per_partition: (
        Annotated[int, checked("rows_per_partition", "an integer >= 1", lambda v: v >= 1, integer=True)] | None
    ) = None


class Policy(Model):
    """A release policy: the dataset, the fixed generalization, the mechanisms and the targets."""

    name: Name
    version: Name
    description: Text | None = None
    dataset: Dataset
    generalization: dict[Name, Scheme] = {}
    candidate_schemes: dict[Name, Annotated[dict[Name, Scheme], at_least(1, "column scheme")]] = {}
    mechanisms: Annotated[tuple[Mechanism, ...], at_least(1, "mechanism")]
    targets: Targets = Targets()
    approval: ApprovalRule | None = None
    engine: EngineSection = EngineSection()

    def scheme_for(self, column: str, candidate: str | None = None) -> _Scheme | None:
        """The scheme of ``column``: the candidate's when it defines one, else ``generalization``."""
        if candidate is not None and column in self.candidate_schemes.get(candidate, {}):
            return self.candidate_schemes[candidate][column]
        return self.generalization.get(column)

    @property
    def charges_budget(self) -> bool:
        """True when a release charges the lifetime budget: it has a differentially private
        mechanism (SPLU-Gen is not DP, so no DP ledger can account it)."""
        return any(mechanism.differentially_private for mechanism in self.mechanisms)

    def mechanism(self, name: str) -> Mechanism:
        """The mechanism called ``name``."""
        for mechanism in self.mechanisms:
            if mechanism.name == name:
                return mechanism
        raise KeyError(name)

    def scheme_locations(self) -> Iterator[tuple[Loc, str, _Scheme]]:
        """Every scheme in the policy with its location and column."""
        for column, scheme in self.generalization.items():
            yield ("generalization", column), column, scheme
        for name, schemes in self.candidate_schemes.items():
            for column, scheme in schemes.items():
                yield ("candidate_schemes", name, column), column, scheme

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        issues = [
            *_check_schemes(self),
            *_check_mechanisms(self),
            *_check_targets(self),
            *_check_person(self),
        ]
        if issues:
            raise FieldError(*issues)
        return self


def _declared(policy: Policy) -> str:
    return ", ".join(policy.dataset.columns)


def _check_schemes(policy: Policy) -> Iterator[Issue]:
    columns = policy.dataset.columns
    for loc, column, scheme in policy.scheme_locations():
        spec = columns.get(column)
        if spec is None:
            yield Issue(
                loc,
                f"column {column!r} is not declared in dataset.columns; declared: {_declared(policy)}",
            )
            continue
        if scheme.numeric and not spec.numeric:
            yield Issue(
                loc,
                f"a {getattr(scheme, 'type', 'numeric')} scheme needs an integer or float column; "
                f"dataset.columns.{column} has type {spec.type}",
            )
        elif spec.values is not None:
            yield from _check_domain(loc, column, scheme, spec.values)


def _check_domain(loc: Loc, column: str, scheme: _Scheme, values: Sequence[Any]) -> Iterator[Issue]:
    """Each declared value of the column must be inside the scheme's domain."""
    if isinstance(scheme, MapScheme) and scheme.default is None:
        missing = [v for v in values if _number_as_text(v) not in scheme.map]
        if missing:
            yield Issue(
                (*loc, "map"),
                f"map has no entry for the declared value(s) {show(missing)} of column {column!r}; "
                "add them or give a default",
            )
    elif isinstance(scheme, BinsScheme):
        outside = [v for v in values if not scheme.bins[0] <= v <= scheme.bins[-1]]
        if outside:
            yield Issue(
                (*loc, "bins"),
                f"declared value(s) {show(outside)} of column {column!r} fall outside the bins "
                f"[{num(scheme.bins[0])}, {num(scheme.bins[-1])}]",
            )


OUTPUT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def _check_mechanisms(policy: Policy) -> Iterator[Issue]:
    names: dict[str, int] = {}  # lower-cased: output files must differ on case-insensitive file systems too
    for i, mechanism in enumerate(policy.mechanisms):
        here: Loc = ("mechanisms", i)
        if not OUTPUT_NAME.fullmatch(mechanism.name):
            yield Issue(
                (*here, "name"),
                f"mechanism name {mechanism.name!r} names its output file: use letters, digits, '-' and '_' "
                "(starting with a letter or digit), at most 64 characters",
            )
        if mechanism.name.lower() in names:
            yield Issue(
                (*here, "name"),
                f"mechanism name {mechanism.name!r} is already used by mechanisms[{names[mechanism.name.lower()]}] "
                "(names are compared ignoring case: each names an output file); names must be unique",
            )
        names.setdefault(mechanism.name.lower(), i)
        for j, candidate in enumerate(mechanism.candidates):
            if candidate not in policy.candidate_schemes:
                defined = ", ".join(policy.candidate_schemes) or "none"
                yield Issue(
                    (*here, "select_scheme", "candidates", j),
                    f"candidate {candidate!r} is not defined in candidate_schemes; defined: {defined}",
                )
        for ref in mechanism.column_refs():
            yield from _check_ref(policy, mechanism, (*here, *ref.loc), ref)
        yield from mechanism.policy_issues(policy, here)


def _check_ref(policy: Policy, mechanism: MechanismKind, loc: Loc, ref: ColumnRef) -> Iterator[Issue]:
    spec = policy.dataset.columns.get(ref.column)
    if spec is None:
        yield Issue(
            loc,
            f"column {ref.column!r} is not declared in dataset.columns; declared: {_declared(policy)}",
        )
        return
    if ref.numeric and not spec.numeric:
        yield Issue(
            loc,
            f"column {ref.column!r} must be integer or float for this statistic; it is {spec.type}",
        )
    if ref.needs_domain and spec.values is None:
        yield Issue(
            loc,
            f"group column {ref.column!r} needs declared values (dataset.columns.{ref.column}.values): "
            "the groups are fixed before the data is read",
        )
    if ref.needs_scheme and ref.column not in policy.generalization:
        candidates = [c for c in mechanism.candidates if c in policy.candidate_schemes]
        if candidates and all(ref.column in policy.candidate_schemes[c] for c in candidates):
            return
        where = f"generalization.{ref.column}"
        if candidates:
            where += " (or a scheme in every candidate: " + ", ".join(candidates) + ")"
        yield Issue(
            loc,
            f"column {ref.column!r} has no generalization scheme; add {where}: keep, suppress, "
            "a hierarchy, bins, top/bottom or a map",
        )


def _check_person(policy: Policy) -> Iterator[Issue]:
    """The person column is a declared column that nothing publishes: no mechanism uses it and
    no generalization (or candidate scheme) generalizes it."""
    person = policy.dataset.person
    if not isinstance(person, Person):
        return
    loc: Loc = ("dataset", "person", "column")
    column = person.column
    if column not in policy.dataset.columns:
        yield Issue(loc, f"person column {column!r} is not declared in dataset.columns; declared: {_declared(policy)}")
        return
    never = "the person column identifies people and is never published"
    for i, mechanism in enumerate(policy.mechanisms):
        if column in mechanism.published_columns():
            yield Issue(loc, f"person column {column!r} is used by mechanisms[{i}] {mechanism.name!r}: {never}")
    for where, scheme_column, _ in policy.scheme_locations():
        if scheme_column == column:
            yield Issue(loc, f"person column {column!r} has a scheme in {'.'.join(map(str, where))}: {never}")


def _check_accuracy(policy: Policy) -> Iterator[Issue]:
    names = [mechanism.name for mechanism in policy.mechanisms]
    for i, target in enumerate(policy.targets.accuracy):
        loc = ("targets", "accuracy", i)
        if target.mechanism not in names:
            yield Issue(
                (*loc, "mechanism"), f"names no mechanism: {target.mechanism!r}; mechanisms: {', '.join(names)}"
            )
            continue
        mechanism = policy.mechanism(target.mechanism)
        kind, wanted = mechanism.type, mechanism.accuracy_fields
        if not wanted:
            elsewhere = f"its accuracy is {mechanism.accuracy_elsewhere}, not" if mechanism.accuracy_elsewhere else "no"
            yield Issue((*loc, "mechanism"), f"{target.mechanism!r} is {kind}: {elsewhere} targets.accuracy")
            continue
        for name in ("table", "cells"):
            if getattr(target, name) is not None and name not in mechanism.accuracy_options:
                yield Issue(
                    (*loc, name),
                    f"{name} applies to a noisy_tables mechanism; {target.mechanism!r} is {kind}: remove {name}",
                )
        stated = {name for name in ("count", "relative_error", "absolute_error") if getattr(target, name) is not None}
        if stated != set(wanted):
            yield Issue(
                loc,
                f"an accuracy target on {kind} {target.mechanism!r} states {' and '.join(wanted)}; got {', '.join(sorted(stated)) or 'neither'}",
            )
        statistics = mechanism.accuracy_statistics
        named = mechanism.statistic_of(target)
        if (named is None) != (not statistics) or (statistics and named not in statistics):
            allowed = f"one of {', '.join(statistics)}" if statistics else f"absent: {kind} publishes one statistic"
            yield Issue((*loc, "statistic"), f"statistic must be {allowed}; got {target.statistic!r}")


def _check_targets(policy: Policy) -> Iterator[Issue]:
    yield from _check_accuracy(policy)
    if policy.targets.delta is not None:
        return
    for i, mechanism in enumerate(policy.mechanisms):
        reason = mechanism.delta_reason()
        if reason is not None:
            yield Issue(
                ("targets", "delta"),
                f"targets.delta is required when a mechanism's guarantee has a delta (mechanisms[{i}] "
                f"{mechanism.name!r} {reason}): the delta to check against, in (0, 1)",
            )
            return
