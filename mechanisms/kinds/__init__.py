"""Mechanism kinds: everything about one ``type`` a policy can name, in one module.

A kind is a subclass of :class:`MechanismKind`: its policy section (pydantic fields and
validation) and, on the same class,

* its **privacy map**: :meth:`~MechanismKind.plan`, the event it releases (whose own rules give
  its guarantee under every accountant, :mod:`privrelease.mechanisms.events`) and the facts
  that follow from the policy alone;
* its **accuracy map**: :meth:`~MechanismKind.accuracy` (data-free accuracy statements,
  published with the release) and :meth:`~MechanismKind.accuracy_check` (a ``targets.accuracy``
  entry checked before any data is read);
* its **engines**: :meth:`~MechanismKind.run` in one process over the whole table, and
  optionally :meth:`~MechanismKind.job` (what a Dask worker computes on one partition) and
  :meth:`~MechanismKind.finish` (the result from the merged partial results);
* its **report**: ``label``, :meth:`~MechanismKind.explanations` and, when it has a tunable
  noise or sampling parameter, :meth:`~MechanismKind.frontier` (what that parameter costs in
  privacy and buys in accuracy, drawn by :mod:`privrelease.reports.charts`).

Everything else (the policy schema's union, the plan, the accountants, PLD, the flow, Dask, the
report, release.json, CLI hints) is derived from the set of kinds: :func:`all_kinds`. Kinds are
the ``KINDS`` of every module of this package, then those of the entry-point group
``privrelease.mechanisms`` (a module with ``KINDS``, or one class), so an agency can ship a kind
in its own package. CONTRIBUTING.md, "Adding a mechanism", walks through one.

**The public surface.** A kind, built in or shipped by another package, imports what it needs
from this module alone: the names of ``__all__`` (the kind's base class and plan types, events
and their guarantees, the result type, the accuracy shapes, the policy field types, the loaded
policy it receives, randomness). They are **stable**: within a major version of privrelease
they are neither removed nor changed incompatibly; every other module is internal and may change
in any release. Each name is documented where it is defined; ``LoadedPolicy`` (what
:meth:`MechanismKind.plan`, :meth:`~MechanismKind.accuracy`, :meth:`~MechanismKind.run` and the
others receive) is the policy as validated (``.policy``: the :class:`Policy`, whose
``.mechanisms`` hold the kinds themselves, ``.dataset.columns`` the declared columns and
``.targets`` the targets), with ``.schemes(columns)`` (the generalization of those columns),
``.sha256`` (the content hash an approval binds) and ``.path`` (the policy file).
"""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points, packages_distributions, version
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from privrelease.errors import UserError
from privrelease.mechanisms.events import AnyEvent, Composed, Event, Sampled, leaves
from privrelease.mechanisms.guarantees import Guarantee, Notion, Unsupported, pure, unsupported
from privrelease.policies.fields import (
    ColumnRef,
    Epsilon,
    FieldError,
    Issue,
    Loc,
    Model,
    Name,
    Names,
    Number,
    at_least,
    checked,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from privrelease.mechanisms.accuracy import (
        CONFIDENCES,
        AccuracyStatement,
        NoiseAccuracy,
        StatedAccuracy,
        laplace_half_width,
    )
    from privrelease.mechanisms.pld import pure_dp_pld
    from privrelease.mechanisms.randomness import bernoulli, permutation, uniform_below
    from privrelease.mechanisms.results import MechanismResult
    from privrelease.policies.loader import LoadedPolicy
    from privrelease.policies.schema import AccuracyTarget, Policy

__all__ = [
    "CONFIDENCES",
    "ENTRY_POINT_GROUP",
    "AccuracyCheck",
    "AccuracyStatement",
    "AccuracyTarget",
    "AnyEvent",
    "Axis",
    "ColumnRef",
    "Composed",
    "Distribution",
    "Epsilon",
    "Event",
    "FieldError",
    "Frontier",
    "Guarantee",
    "Issue",
    "Job",
    "LoadedPolicy",
    "Loc",
    "MechanismKind",
    "MechanismResult",
    "Model",
    "Name",
    "Names",
    "NoiseAccuracy",
    "Notion",
    "Number",
    "Planned",
    "Policy",
    "Sampled",
    "StatedAccuracy",
    "Unsupported",
    "all_kinds",
    "at_least",
    "bernoulli",
    "checked",
    "defined_by",
    "epsilon_at_target",
    "frontier_of",
    "half_width_target",
    "laplace_half_width",
    "leaves",
    "log_grid",
    "permutation",
    "pure",
    "pure_dp_pld",
    "uniform_below",
    "unsupported",
]

_LAZY = {
    "privrelease.mechanisms.accuracy": (
        "CONFIDENCES",
        "AccuracyStatement",
        "NoiseAccuracy",
        "StatedAccuracy",
        "laplace_half_width",
    ),
    "privrelease.mechanisms.pld": ("pure_dp_pld",),
    "privrelease.mechanisms.randomness": ("bernoulli", "permutation", "uniform_below"),
    "privrelease.mechanisms.results": ("MechanismResult",),
    "privrelease.policies.loader": ("LoadedPolicy",),
    "privrelease.policies.schema": ("AccuracyTarget", "Policy"),
}
"""Names of ``__all__`` imported on first use: the policy schema imports this module (so the
loader and schema cannot be imported here first), and a command that only reads a policy need
not import pyarrow."""


def __getattr__(name: str) -> Any:
    for module, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ENTRY_POINT_GROUP = "privrelease.mechanisms"


@dataclass(frozen=True)
class Planned:
    """What a mechanism releases, from the policy alone: its event and facts about it
    (published in the plan and the report). ``event`` None: it cannot run; ``infeasible`` names
    the requirement it misses (what, required), a failed check of the plan."""

    event: Event | None
    facts: dict[str, Any] = field(default_factory=dict)
    infeasible: tuple[str, str] | None = None


@dataclass(frozen=True)
class AccuracyCheck:
    """One ``targets.accuracy`` entry against the kind's data-free accuracy: ``value``
    ``relation`` ``limit`` passes (``value`` None: no statement could be made, ``achieved``
    says why)."""

    what: str
    relation: Literal["<=", ">="]
    limit: float
    value: float | None
    achieved: str = ""

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return self.value <= self.limit if self.relation == "<=" else self.value >= self.limit


@dataclass(frozen=True)
class Frontier:
    """The privacy-accuracy frontier of a mechanism's tunable parameter, as plain data: at each
    of ``values`` of the parameter (the policy's own, ``chosen``, among them), the epsilon at
    the policy's target delta by the policy's accountant (:func:`epsilon_at_target`; inf where
    no epsilon reaches it) and the kind's accuracy measure. ``accuracy_target`` (a rule on the
    accuracy axis) and ``privacy_target`` (``targets.max_epsilon``) are None when the policy
    sets none; ``log_x``: the values are drawn on a log axis."""

    parameter: str
    """How the parameter is written, e.g. "β" or "σ"."""
    setting: str
    """Where it sits in the mechanism's policy section, e.g. "beta" or "noise.sigma"."""
    values: tuple[float, ...]
    privacy: tuple[float, ...]
    privacy_label: str
    accuracy: tuple[float, ...]
    accuracy_label: str
    chosen: float
    higher_is_more_accurate: bool
    privacy_target: float | None = None
    accuracy_target: float | None = None
    accuracy_target_label: str = ""
    log_x: bool = False
    note: str = ""
    """A sentence for the caption (what the accuracy measure is, defaults used)."""

    def __post_init__(self) -> None:
        assert len(self.values) == len(self.privacy) == len(self.accuracy) >= 2, "one privacy and accuracy per value"
        assert list(self.values) == sorted(set(self.values)), "values increase"
        assert self.chosen in self.values, "the policy's value is on the frontier"

    @property
    def chosen_index(self) -> int:
        return self.values.index(self.chosen)


FRONTIER_STEPS = 8
"""Points a decade of a frontier's log grid (:func:`log_grid`)."""

FRONTIER_CONFIDENCE = 0.95
"""The confidence of a frontier's half-width without an accuracy target naming the mechanism."""


def epsilon_at_target(loaded: LoadedPolicy, event: Event) -> float:
    """The epsilon of ``event`` alone at the policy's ``targets.delta`` under its
    ``targets.accounting``, by the tightest method (:func:`~privrelease.mechanisms.composition.epsilon_at`,
    as the plan states a release's guarantee); without a delta target, its pure epsilon
    (:func:`~privrelease.mechanisms.accountants.account`), inf when it has none."""
    from privrelease.mechanisms import accountants, composition

    targets = loaded.policy.targets
    if targets.delta is None:
        guarantee = accountants.account(event, targets.accounting)
        return guarantee.epsilon if guarantee.supported and guarantee.delta == 0 else math.inf
    return composition.epsilon_at([event], targets.delta, notion=targets.accounting).epsilon


def log_grid(chosen: float, low: float = 0.0, high: float = math.inf) -> list[float]:
    """``chosen`` times 10^(i / FRONTIER_STEPS) for i = -FRONTIER_STEPS..FRONTIER_STEPS (a
    decade either side), those in (low, high], and ``chosen``."""
    steps = [chosen * 10.0 ** (i / FRONTIER_STEPS) for i in range(-FRONTIER_STEPS, FRONTIER_STEPS + 1)]
    return sorted({*(v for v in steps if low < v <= high), chosen})


def half_width_target(loaded: LoadedPolicy, name: str, statistic: str | None = None) -> tuple[float, float | None, str]:
    """The confidence, limit and rule label of the ``absolute_error`` accuracy target naming
    mechanism ``name`` (and ``statistic``, when given; default confidence
    :data:`FRONTIER_CONFIDENCE`, no limit)."""
    for target in loaded.policy.targets.accuracy:
        if target.mechanism == name and target.absolute_error is not None and statistic in (None, target.statistic):
            return target.confidence, target.absolute_error, f"required ±{target.absolute_error:g}"
    return FRONTIER_CONFIDENCE, None, ""


@dataclass(frozen=True)
class Axis:
    """How a kind names its frontier's parameter and accuracy (:func:`frontier_of`)."""

    parameter: str
    setting: str
    accuracy_label: str
    higher_is_more_accurate: bool
    note: str
    accuracy_target: float | None = None
    accuracy_target_label: str = ""
    log_x: bool = False


def frontier_of(
    loaded: LoadedPolicy,
    axis: Axis,
    chosen: float,
    values: Iterable[float],
    event_of: Callable[[float], Event | None],
    accuracy_of: Callable[[float], float],
) -> Frontier:
    """A :class:`Frontier` at ``values`` (with ``chosen``): each value's release ``event_of``
    (None: not a release, left out) at :func:`epsilon_at_target`, its ``accuracy_of``."""
    kept, privacy, accuracy = [], [], []
    for value in sorted({*values, chosen}):
        event = event_of(value)
        if event is None:
            assert value != chosen, "the policy's own value plans a release"
            continue
        kept.append(value)
        privacy.append(epsilon_at_target(loaded, event))
        accuracy.append(float(accuracy_of(value)))
    targets = loaded.policy.targets
    label = (
        f"ε (pure, {targets.accounting})"
        if targets.delta is None
        else f"ε at δ = {targets.delta:g} ({targets.accounting})"
    )
    return Frontier(
        axis.parameter,
        axis.setting,
        tuple(kept),
        tuple(privacy),
        label,
        tuple(accuracy),
        axis.accuracy_label,
        chosen,
        axis.higher_is_more_accurate,
        privacy_target=targets.max_epsilon,
        accuracy_target=axis.accuracy_target,
        accuracy_target_label=axis.accuracy_target_label,
        log_x=axis.log_x,
        note=axis.note,
    )


class Job(Protocol):
    """A mechanism's work on Dask: a partial result per partition, merged in partition order."""

    def partial(self, table: pa.Table) -> Any: ...

    def merge(self, parts: list[Any]) -> Any: ...


class ColumnPartial(Protocol):
    """A job's partial result on a partition given one column at a time (each dropped after)."""

    def add(self, name: str, column: pa.ChunkedArray) -> None: ...

    def result(self) -> Any: ...


@runtime_checkable
class ColumnJob(Job, Protocol):
    """A :class:`Job` that can also take a partition one column at a time: its
    :meth:`column_partial` on the partition's ``rows`` rows, given every declared column, is
    its :meth:`partial` of them (same distribution), without the columns held together."""

    def column_partial(self, rows: int) -> ColumnPartial: ...


def by_columns(job: ColumnJob, table: pa.Table) -> Any:
    """``job``'s partial result on ``table`` given one column at a time: its :meth:`partial`,
    in one code path with the read of a partition by columns."""
    return fed(job.column_partial(table.num_rows), table).result()


Fed = TypeVar("Fed", bound=ColumnPartial)


def fed(partial: Fed, table: pa.Table) -> Fed:
    """``partial`` given every column of ``table``, one at a time."""
    for name in table.column_names:
        partial.add(name, table.column(name))
    return partial


class MechanismKind(Model):
    """The base of every mechanism kind (see the module docstring). The defaults fail closed:
    a kind that does not plan cannot be planned, one without a job runs in-process only."""

    name: Name
    if TYPE_CHECKING:
        type: str
        """Every kind declares ``type: Literal[...]``, its tag in the policy."""

    differentially_private: ClassVar[bool] = True
    """Whether its release claims DP (then it charges the dataset's lifetime budget); its
    events say the same (:attr:`~privrelease.mechanisms.events.Event.differentially_private`)."""
    label: ClassVar[str] = ""
    """How the report names the kind, e.g. "(k, β)-SDGS microdata"."""
    in_process_only: ClassVar[str] = ""
    """Why it cannot run on Dask (when :meth:`job` is None)."""
    accuracy_statistics: ClassVar[tuple[str, ...]] = ()
    """The statistics a ``targets.accuracy`` entry names in ``statistic`` when the kind publishes
    several (none: it publishes one, and ``statistic`` is refused)."""
    accuracy_default_statistic: ClassVar[str | None] = None
    """The statistic a ``targets.accuracy`` entry without ``statistic`` names (None: an entry must
    name one of :attr:`accuracy_statistics` when there are any)."""
    accuracy_fields: ClassVar[tuple[str, ...]] = ()
    """Which fields of a ``targets.accuracy`` entry it checks (none: it takes no such target)."""
    omitted_when_absent: ClassVar[tuple[tuple[str, ...], ...]] = ()
    """Optional fields (paths in its section) added after policies were approved: left out of the
    canonical form when None, so those policies keep their hash."""
    accuracy_options: ClassVar[tuple[str, ...]] = ()
    """Which optional fields of a ``targets.accuracy`` entry it reads (``table``, ``cells``)."""
    accuracy_elsewhere: ClassVar[str] = ""
    """Where its accuracy is targeted instead, when it takes no ``targets.accuracy`` entry."""
    reads_max_rows: ClassVar[bool] = False
    """With ``dataset.person`` naming a column: True, it reads up to ``max_rows`` rows of each
    person and its event's sensitivity is ``max_rows`` (``dataset.rows_per_person``); False (the
    default, a paper's one row per person), it reads ONE random row of each person
    (:mod:`privrelease.mechanisms.persons`)."""

    @classmethod
    def kind_type(cls) -> str:
        """The ``type`` tag of the kind (the ``Literal`` of its ``type`` field)."""
        (tag,) = cls.model_fields["type"].annotation.__args__  # type: ignore[union-attr]
        return str(tag)

    # --- the policy -----------------------------------------------------------------------

    def column_refs(self) -> list[ColumnRef]:
        """Every column the mechanism uses."""
        return []

    def published_columns(self) -> tuple[str, ...]:
        """The columns its output publishes (generalized, counted or summarized), each once in
        the policy's order: every column it uses (the report's "Columns published")."""
        return tuple(dict.fromkeys(ref.column for ref in self.column_refs()))

    def column_scheme(self, policy: Policy, column: str) -> Any:
        """The policy's scheme a published column's labels come from (None: kept as is)."""
        return policy.scheme_for(column)

    def delta_reason(self) -> str | None:
        """Why its guarantee has a delta > 0 (then the policy must state ``targets.delta``),
        e.g. "has beta 0.1 < 1"; None for pure DP or no DP."""
        return None

    @property
    def candidates(self) -> tuple[str, ...]:
        """Candidate scheme names the mechanism chooses among (none: ``generalization`` only)."""
        return ()

    def policy_issues(self, policy: Policy, here: Loc) -> Iterator[Issue]:
        """Problems only the whole policy shows (beyond the columns, checked for every kind)."""
        return iter(())

    # --- privacy and accuracy maps --------------------------------------------------------

    def plan(self, loaded: LoadedPolicy) -> Planned:
        """The event it releases and the facts, from the policy alone (no data)."""
        raise NotImplementedError(f"mechanism type {self.kind_type()!r} has no privacy map")

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement | None:
        """What its published numbers are worth, from the policy alone (published)."""
        return None

    def expected_rows(self, loaded: LoadedPolicy) -> float | None:
        """About how many rows its output would hold before anything is suppressed, from the
        policy alone (None: the policy does not say); a release far below it says so."""
        return None

    def resolved(self, loaded: LoadedPolicy) -> MechanismKind:
        """This mechanism with every parameter the plan chooses filled in (noise left out of
        the policy, chosen to meet its accuracy targets): what ran, as release.json and the
        report state it. Itself when the policy gives every parameter."""
        return self

    def plan_warnings(self, loaded: LoadedPolicy) -> tuple[str, ...]:
        """What the policy alone shows a run will likely miss (e.g. generalized cells too many
        for the expected sample to reach k): warned by ``plan`` before any data is read, never
        a failed check."""
        return ()

    def statistic_of(self, target: AccuracyTarget) -> str | None:
        """The statistic ``target`` names: its ``statistic``, else :attr:`accuracy_default_statistic`."""
        return target.statistic if target.statistic is not None else self.accuracy_default_statistic

    def accuracy_check(self, loaded: LoadedPolicy, target: AccuracyTarget, planned: Planned) -> AccuracyCheck:
        """One ``targets.accuracy`` entry naming this mechanism (its ``accuracy_fields``)."""
        raise NotImplementedError(f"mechanism type {self.kind_type()!r} takes no accuracy target")

    # --- engines --------------------------------------------------------------------------

    def run(self, loaded: LoadedPolicy, table: pa.Table) -> MechanismResult:
        """Run it in this process over the whole table. By default, a kind with a Dask
        :meth:`job` runs as on Dask with the whole table as its one partition:
        ``finish(job.partial(table))`` (one code path for both engines)."""
        job = self.job(loaded)
        if job is None:
            raise NotImplementedError(f"mechanism type {self.kind_type()!r} has no engine")
        return self.finish(loaded, job.partial(table))

    def job(self, loaded: LoadedPolicy) -> Job | None:
        """Its Dask job (None: it runs in-process only, for the reason ``in_process_only``)."""
        return None

    def finish(self, loaded: LoadedPolicy, merged: Any) -> MechanismResult:
        """Its result from the merged partial results of :meth:`job` (on Dask)."""
        raise NotImplementedError(f"mechanism type {self.kind_type()!r} does not run on Dask")

    # --- report ---------------------------------------------------------------------------

    def frontier(self, loaded: LoadedPolicy) -> Frontier | None:
        """Its privacy-accuracy frontier over its tunable parameter, from the policy alone (None:
        it has no such parameter, or the policy's value cannot be charted)."""
        return None

    def explanations(self) -> tuple[str, ...]:
        """Paragraphs for the report's "What these guarantees mean" (Jinja: ``<dt>``/``<dd>``
        HTML, rendered with the report's view), identical ones shown once."""
        return ()

    def files_in_words(self, files: Sequence[tuple[str, int]], public: Mapping[str, Any]) -> str | None:
        """How to read its output's published ``files`` (name, rows; in order), given its run's
        ``public`` facts, for the report and ``release.json``; None for one file. Default: the
        parts of one dataset (SDGS microdata written on Dask, each file by a worker)."""
        if len(files) < 2:
            return None
        rows = sum(count for _, count in files)
        return f"The output of {self.name} is {len(files)} files, {rows} rows together: read them all (one dataset)."

    def example_run(self, loaded: LoadedPolicy, rows: int) -> tuple[dict[str, Any], int | dict[str, int]]:
        """Made-up internal facts of a run of ``loaded`` over ``rows`` rows, shaped like its
        engine's, and the rows it would publish (a dict: per file of an output in several, by
        part name): for report previews and tests (:func:`.reports.context.example_context`).
        Default: a statistic, one published row."""
        return {"rows_in": rows}, 1


def _kinds_of(source: ModuleType | type) -> tuple[Any, ...]:
    """The kinds a module lists in ``KINDS``, or the one class."""
    if isinstance(source, type):
        return (source,)
    return tuple(getattr(source, "KINDS", ()))


@dataclass(frozen=True)
class Distribution:
    """The installed distribution (``pip`` package) that ships a mechanism kind or event
    through the entry-point group :data:`ENTRY_POINT_GROUP`: recorded with every run that uses
    the kind and every stored event tree holding its events, so an auditor knows what to
    install to replay them."""

    name: str
    version: str

    def as_dict(self) -> dict[str, str]:
        return {"distribution": self.name, "version": self.version}


def _plugin(point: EntryPoint) -> str:
    """An entry point as a refusal names it: its name, value and distribution."""
    dist = point.dist
    shipped = f"distribution {dist.name} {dist.version}" if dist is not None else "no installed distribution"
    return f"mechanism plugin {point.name!r} = {point.value!r} (entry point group {ENTRY_POINT_GROUP}, {shipped})"


def _load(point: EntryPoint) -> Any:
    """The module or class of an entry point; a :class:`UserError` naming the plugin, its
    distribution and the error in one line when it cannot be imported."""
    try:
        return point.load()
    except Exception as error:  # whatever a plugin's import raises, the command fails in one line
        reason = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        uninstall = f"; fix it or pip uninstall {point.dist.name}" if point.dist is not None else ""
        raise UserError(f"{_plugin(point)} cannot be imported: {reason}{uninstall}") from error


_SHIPPED: dict[str, Distribution] = {}
"""The module of each plugin entry point -> its distribution (filled by :func:`all_kinds`)."""


@functools.cache
def all_kinds() -> dict[str, type[MechanismKind]]:
    """Every mechanism kind by its ``type``: this package's (by type), then the entry points'.
    A plugin that cannot be imported, a ``type`` defined twice or a class that is not a kind is
    a :class:`UserError` naming the entry point and its distribution."""
    found: dict[str, type[MechanismKind]] = {}
    own = [
        (module.name, importlib.import_module(f"{__name__}.{module.name}")) for module in pkgutil.iter_modules(__path__)
    ]
    sources: list[tuple[str, Any]] = sorted(
        ((where, kind) for where, module in own for kind in _kinds_of(module)), key=lambda pair: pair[1].kind_type()
    )
    _SHIPPED.clear()
    for point in entry_points(group=ENTRY_POINT_GROUP):
        sources += [(_plugin(point), kind) for kind in _kinds_of(_load(point))]
        if point.dist is not None:
            _SHIPPED[point.module] = Distribution(point.dist.name, point.dist.version)
    for where, kind in sources:
        if not (isinstance(kind, type) and issubclass(kind, MechanismKind)):
            raise UserError(f"{where}: {kind!r} is not a MechanismKind subclass")
        tag = kind.kind_type()
        if found.get(tag, kind) is not kind:
            raise UserError(
                f"{where}: mechanism type {tag!r} is defined twice (already by {found[tag].__module__}); "
                "a type is never replaced: rename it in the plugin or uninstall one"
            )
        found[tag] = kind
    return found


def defined_by(cls: type) -> Distribution | None:
    """The plugin distribution that defines a kind or event class (None: built into privrelease)."""
    parts = cls.__module__.split(".")
    if parts[0] == "privrelease":
        return None
    all_kinds()
    for end in range(len(parts), 0, -1):  # the entry point's module, or a package holding the class's module
        if ".".join(parts[:end]) in _SHIPPED:
            return _SHIPPED[".".join(parts[:end])]
    names = packages_distributions().get(parts[0], [])
    _SHIPPED[parts[0]] = Distribution(names[0], version(names[0])) if names else Distribution(parts[0], "unknown")
    return _SHIPPED[parts[0]]
