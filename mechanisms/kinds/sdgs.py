"""(k, beta)-SDGS microdata and crowd-blending histograms: sample each row with probability
beta, generalize by the policy's data-independent scheme, suppress the generalized values
occurring fewer than k times (Li, Qardaji, Su, Algorithm 4); the histogram publishes the counts
of the surviving cells (Gehrke et al.), which releases the same information and is accounted
identically. With ``select_scheme``, the exponential mechanism first picks the scheme among
candidates (eps-safe k-anonymization, Li-Qardaji-Su Section 3.2); the two events compose.

Privacy: :class:`~privrelease.mechanisms.events.SDGS` (Theorem 1 / the exact profile / its PLD).
Accuracy: :mod:`privrelease.mechanisms.accuracy` (publication probability, relative standard
error of count / beta, exact conditional interval, suppression bias; the selection gap); after
the data, :mod:`privrelease.mechanisms.count_intervals` (an exact interval for the people behind
each published count: the histogram's ``estimate``, ``lower`` and ``upper`` columns; for
microdata, the same columns in a companion output of its published cells, ``<name>.cells``).
Dask: each partition counts its own Bernoulli(beta) sample per cell (:class:`CellJob`); the
flow suppresses with the merged counts of the whole sample and writes the microdata as a
uniformly random order of the published rows (:mod:`privrelease.mechanisms.partitioned`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import model_validator

from privrelease.mechanisms.events import SDGS, BoundedRangeSelection, ExponentialSelection
from privrelease.mechanisms.kinds import (
    AccuracyCheck,
    Axis,
    ColumnRef,
    Composed,
    Epsilon,
    Event,
    FieldError,
    Frontier,
    Issue,
    Loc,
    MechanismKind,
    MechanismResult,
    Model,
    Names,
    Planned,
    at_least,
    by_columns,
    frontier_of,
    leaves,
)
from privrelease.policies.fields import Beta, K, PositiveEpsilon, num

if TYPE_CHECKING:
    import pyarrow as pa

    from privrelease.mechanisms.kinds import AccuracyStatement, AccuracyTarget, LoadedPolicy, Policy
    from privrelease.mechanisms.schemes import ColumnScheme

SELECTION_FAILURE = 0.05
"""The failure probability t at which the selection's utility gap is stated."""

FRONTIER_BETAS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
"""The sampling rates a frontier is drawn at (with the policy's own): denser where the
privacy loss moves fastest (one release: its exact curve inverted, about 10 ms a point)."""
FRONTIER_PRECISION = 1e-6
"""How close a frontier point's epsilon is to the smallest meeting the target delta (relative,
never below it): a chart needs no more, and each digit costs bisection steps."""

FRONTIER_BETAS_COMPOSED = (0.02, 0.05, 0.2)
"""The coarser grid when the release composes two events (``select_scheme``): each point then
builds the SDGS privacy loss distribution (0.1 to 0.3 s, more for a larger beta; the policy's own is
cached by the plan)."""

FRONTIER_COUNT = 1000
FRONTIER_RELATIVE_ERROR = 0.25
"""The cell (people, relative error) a frontier's accuracy is stated for without an accuracy target."""


class SelectScheme(Model):
    """eps-safe k-anonymization: the exponential mechanism picks one of ``candidates``."""

    epsilon: PositiveEpsilon
    candidates: Annotated[Names, at_least(2, "candidate schemes to choose from")]


class Generalizing(MechanismKind):
    """Shared fields and behaviour of SDGS and the crowd-blending histogram (epsilon needed
    when sampling)."""

    columns: Annotated[Names, at_least(1, "column")]
    k: K
    beta: Beta = 1.0
    epsilon: Epsilon | None = None

    accuracy_fields: ClassVar[tuple[str, ...]] = ("count", "relative_error")

    def column_refs(self) -> list[ColumnRef]:
        return [ColumnRef(("columns", i), c, needs_scheme=True) for i, c in enumerate(self.columns)]

    def policy_issues(self, policy: Policy, here: Loc) -> Iterator[Issue]:
        """No column named like a column of the published cells (``count``, ``estimate``,
        ``lower``, ``upper``: the histogram, or the microdata's companion file), refused before
        the data is read (a histogram's run checks the same)."""
        from privrelease.mechanisms.columns import HISTOGRAM, taken_name

        table = "a histogram" if self.output == "histogram" else "SDGS microdata (its published cells' file)"
        for i, column in enumerate(self.columns):
            if (taken := taken_name(column, table, HISTOGRAM)) is not None:
                yield Issue((*here, "columns", i), taken)

    def delta_reason(self) -> str | None:
        return f"has beta {num(self.beta)} < 1" if self.beta < 1 else None

    @model_validator(mode="after")
    def _epsilon_when_sampling(self) -> Generalizing:
        if self.epsilon is None and self.beta < 1:
            raise FieldError.at(
                ("epsilon",),
                f"epsilon is required when beta < 1 (beta is {num(self.beta)}): the epsilon "
                "at which delta = d(k, beta, epsilon) is stated, a number >= 0",
            )
        return self

    output: ClassVar[Literal["microdata", "histogram"]]
    """What it publishes: the rows, or only the counts per cell (the same information)."""

    def _event(self) -> SDGS:
        return SDGS(k=self.k, beta=self.beta, epsilon=self.epsilon or 0.0, output=self.output)

    def plan(self, loaded: LoadedPolicy) -> Planned:
        return Planned(
            self._event(),
            {"k_anonymity": self.k, "crowd_blending": f"({self.k}, 0)-crowd-blending private"},
        )

    def plan_warnings(self, loaded: LoadedPolicy) -> tuple[str, ...]:
        """Cells unlikely to reach k, from the policy alone: a column kept raw with no declared
        domain leaves the number of generalized cells C unbounded; with the declared domains,
        N rows x beta sampled rows spread over C cells average N beta / C a cell, and at most
        N beta / k cells can reach k. Warned when every scheme the release may use (each
        candidate under ``select_scheme``) averages below k or has an unbounded column."""
        found = [self._cell_warning(loaded, candidate) for candidate in self.candidates or (None,)]
        return () if any(warning is None for warning in found) else tuple(w for w in found if w is not None)

    def _cell_warning(self, loaded: LoadedPolicy, candidate: str | None) -> str | None:
        import math

        counts = {column: loaded.label_count(column, candidate) for column in self.columns}
        where = f"{self.name}" + (f" (candidate {candidate})" if candidate else "")
        raw = [column for column, count in counts.items() if count is None]
        known = {column: count for column, count in counts.items() if count is not None}
        cells = math.prod(known.values())
        rows = loaded.policy.dataset.rows
        if raw:
            return (
                f"{where}: {', '.join(raw)} kept raw with no declared domain (dataset.columns.<column>.values), so "
                f"the number of generalized cells is unknown before the data; a column with many distinct values "
                f"(an age, a zip code, a diagnosis) leaves most cells under k = {self.k} and the release may "
                "publish nothing: declare the values and coarsen them (bins, map, hierarchy)"
            )
        if rows is None or rows * self.beta >= self.k * cells:
            return None
        sampled = rows * self.beta
        sizes = " x ".join(f"{count:,} ({column})" for column, count in known.items())
        unit = loaded.policy.dataset.size_unit  # with a person column, dataset.rows counts people (one row each)
        if sampled < self.k:
            outcome = f"the whole expected sample is below k = {self.k}: the release will almost surely publish nothing"
        else:
            outcome = (
                f"so at most about {math.floor(sampled / self.k):,} of the {cells:,} cells can reach k and, unless the "
                f"people crowd into a few cells, most {unit} will be suppressed"
            )
        return (
            f"{where}: {rows:,} {unit} x beta {self.beta:g} = {sampled:,.0f} sampled {unit} expected over "
            f"{cells:,} generalized cells ({sizes}): {sampled / cells:.3g} a cell on average, below k = {self.k}, "
            f"{outcome}: coarsen the scheme, or see `privrelease calibrate sdgs` (a larger beta or a smaller k)"
        )

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement:
        """Per cell size N: publication probability, relative standard error of count / beta,
        the exact conditional interval (at :meth:`interval_confidence`) and the suppression bias
        (:mod:`.accuracy`)."""
        from privrelease.mechanisms import accuracy

        k, beta, confidence = self.k, self.beta, self.interval_confidence(loaded)
        targets = tuple(t.count for t in loaded.policy.targets.accuracy if t.mechanism == self.name and t.count)
        return accuracy.AccuracyStatement(
            "the published count" if beta >= 1 else f"the published count / beta = count x {1 / beta:g}",
            cells=tuple(
                accuracy.count_accuracy(k, beta, n, confidence=confidence)
                for n in accuracy.cell_sizes(k, beta, targets)
            ),
            published_counts=accuracy.published_counts(k, beta, confidence, self.output),
        )

    def interval_confidence(self, loaded: LoadedPolicy) -> float:
        """The confidence of the intervals, before the data for each cell size and after it for
        the people behind each published count: the highest
        confidence of the accuracy targets naming this mechanism, else
        :data:`.count_intervals.DEFAULT_CONFIDENCE`."""
        from privrelease.mechanisms.count_intervals import DEFAULT_CONFIDENCE

        stated = [t.confidence for t in loaded.policy.targets.accuracy if t.mechanism == self.name]
        return max(stated, default=DEFAULT_CONFIDENCE)

    def accuracy_check(self, loaded: LoadedPolicy, target: AccuracyTarget, planned: Planned) -> AccuracyCheck:
        """A cell of ``count`` people published and within +-relative_error, with probability
        at least ``confidence`` (:func:`.accuracy.count_accuracy`)."""
        from privrelease.mechanisms.accuracy import count_accuracy

        assert target.count is not None and target.relative_error is not None
        result = count_accuracy(self.k, self.beta, target.count, relative_error=target.relative_error)
        return AccuracyCheck(
            f"a cell of {target.count} people published and within +-{target.relative_error:.0%}",
            ">=",
            target.confidence,
            result.within,
        )

    def job(self, loaded: LoadedPolicy) -> CellJob | SelectionJob:
        return CellJob(loaded.schemes(self.columns), self.beta)

    def frontier(self, loaded: LoadedPolicy) -> Frontier:
        """Over beta: the epsilon of the release at the target delta (this kind with that beta
        planned, :func:`.epsilon_at_target`; under ``probabilistic``, the release stated at
        the smallest epsilon where Theorem 1 reaches the target delta) and the probability that
        a cell of the accuracy target's count N (default 1,000) is published and within
        +-r (default 25%): :func:`.accuracy.count_accuracy`'s ``within``."""
        from privrelease.mechanisms.accuracy import count_accuracy

        targets = loaded.policy.targets
        target = next((t for t in targets.accuracy if t.mechanism == self.name and t.count and t.relative_error), None)
        count = target.count if target is not None and target.count else FRONTIER_COUNT
        error = target.relative_error if target is not None and target.relative_error else FRONTIER_RELATIVE_ERROR
        single = len(leaves(self.plan(loaded).event or Composed(events=()))) == 1
        axis = Axis(
            "β",
            "beta",
            f"P(a cell of {count:,} published and within ±{error:.0%})",
            True,
            f"Accuracy: the probability that a cell of {count:,} people is published (at least k = {self.k} "
            f"of them sampled) and its estimate count/β is within ±{error:.0%}"
            + ("" if target is not None else " (no accuracy target names this mechanism: a default cell)")
            + ".",
            target.confidence if target is not None else None,
            f"required confidence {target.confidence:g}" if target is not None else "",
        )
        return frontier_of(
            loaded,
            axis,
            self.beta,
            FRONTIER_BETAS if single else FRONTIER_BETAS_COMPOSED,
            lambda beta: self._frontier_event(loaded, beta),
            lambda beta: count_accuracy(self.k, beta, count, relative_error=error).within or 0.0,
        )

    def _frontier_event(self, loaded: LoadedPolicy, beta: float) -> Event | None:
        """The release with sampling rate ``beta`` (under ``probabilistic``, stated at the
        smallest epsilon where Theorem 1 reaches the target delta, when one does)."""
        from privrelease.mechanisms.sdgs_calibration import CalibrationError, smallest_epsilon

        targets = loaded.policy.targets
        update: dict[str, Any] = {"beta": beta}
        if targets.accounting == "probabilistic" and targets.delta is not None and beta < 1:
            try:
                calibrated = smallest_epsilon(self.k, beta, targets.delta, "probabilistic", relative=FRONTIER_PRECISION)
                update["epsilon"] = calibrated.epsilon
            except CalibrationError:
                pass  # stated at the policy's epsilon, whose delta misses the target: epsilon inf
        return self.model_copy(update=update).plan(loaded).event

    def explanations(self) -> tuple[str, ...]:
        return (KDGS,) if self.beta >= 1 else (SAMPLED,)

    def example_run(self, loaded: LoadedPolicy, rows: int) -> tuple[dict[str, Any], int]:
        """beta rows sampled, one in 97 of them suppressed; microdata publishes the rest, a
        histogram one row per cell (made up: a cell per 4k rows kept)."""
        sampled = round(rows * self.beta)
        kept = sampled - sampled // 97
        published = kept if self.output == "microdata" else max(1, kept // (4 * self.k))
        return {"rows_in": rows, "rows_sampled": sampled, "rows_suppressed": sampled // 97}, published


class SdgsMechanism(Generalizing):
    """(k, beta)-SDGS microdata (Li, Qardaji, Su, Algorithm 4): sample with probability beta,
    generalize by the fixed scheme, suppress generalized rows occurring fewer than k times.
    Beside the rows, the file ``NAME.cells`` lists each published cell with its count,
    ``estimate`` and exact interval [``lower``, ``upper``] for the people behind it (as a
    histogram's)."""

    type: Literal["sdgs"]
    beta: Beta
    select_scheme: SelectScheme | None = None

    label: ClassVar[str] = "(k, β)-SDGS microdata"
    output: ClassVar[Literal["microdata", "histogram"]] = "microdata"

    @property
    def candidates(self) -> tuple[str, ...]:
        return self.select_scheme.candidates if self.select_scheme else ()

    def _selection(self) -> ExponentialSelection | None:
        from privrelease.mechanisms.selection import sensitivity

        if self.select_scheme is None:
            return None
        return BoundedRangeSelection(
            epsilon=self.select_scheme.epsilon,
            candidates=len(self.select_scheme.candidates),
            sensitivity=sensitivity(self.k, self.beta),
        )

    def plan(self, loaded: LoadedPolicy) -> Planned:
        planned = super().plan(loaded)
        selection = self._selection()
        if selection is None or self.select_scheme is None:
            return planned
        facts = {**planned.facts, "candidate_schemes": list(self.select_scheme.candidates)}
        assert planned.event is not None
        return Planned(Composed(events=(selection, planned.event)), facts)

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement:
        """Also, with ``select_scheme``: the exponential mechanism's utility gap (the chosen
        score within (Delta / eps) ln(|candidates| / t) of the best, with probability 1 - t)."""
        from dataclasses import replace

        from privrelease.mechanisms.accuracy import SelectionGap, selection_gap

        statement = super().accuracy(loaded, planned)
        selection = self._selection()
        if selection is None:
            return statement
        gap = selection_gap(selection.sensitivity, selection.epsilon, selection.candidates, SELECTION_FAILURE)
        return replace(statement, selection_gap=SelectionGap(SELECTION_FAILURE, gap))

    def expected_rows(self, loaded: LoadedPolicy) -> float | None:
        """The expected sample, N rows x beta, when the policy declares N (``dataset.rows``)."""
        rows = loaded.policy.dataset.rows
        return None if rows is None else rows * self.beta

    def _candidates(self, loaded: LoadedPolicy) -> dict[str, dict[str, ColumnScheme]]:
        assert self.select_scheme is not None
        return {name: loaded.schemes(self.columns, candidate=name) for name in self.select_scheme.candidates}

    def run(self, loaded: LoadedPolicy, table: pa.Table) -> MechanismResult:
        """SDGS over the policy's scheme, or over the scheme the exponential mechanism selects
        among the candidates (the events compose)."""
        from privrelease.mechanisms.sdgs import sdgs
        from privrelease.mechanisms.selection import select_scheme

        epsilon, confidence = self.epsilon or 0.0, self.interval_confidence(loaded)
        if self.select_scheme is None:
            schemes = loaded.schemes(self.columns)
            return sdgs(table, schemes, k=self.k, beta=self.beta, epsilon=epsilon, confidence=confidence)
        selection = select_scheme(
            table, self._candidates(loaded), k=self.k, beta=self.beta, epsilon=self.select_scheme.epsilon
        )
        result = sdgs(table, selection.scheme, k=self.k, beta=self.beta, epsilon=epsilon, confidence=confidence)
        return _selected(result, selection)

    def job(self, loaded: LoadedPolicy) -> CellJob | SelectionJob:
        if self.select_scheme is None:
            return super().job(loaded)
        return SelectionJob(self._candidates(loaded), self.beta)

    def finish(self, loaded: LoadedPolicy, merged: Any) -> MechanismResult:
        """Suppress with the merged counts; the microdata as pieces, each published row in a
        uniformly random piece and position (:func:`.partitioned.microdata`). With
        ``select_scheme`` the exponential mechanism first chooses a candidate from the merged
        counts of all rows (as in-process), and the release is that candidate's sample, drawn
        independently of the choice: the in-process distribution, and the same composed event."""
        from privrelease.mechanisms import partitioned

        selection = None
        if self.select_scheme is not None:
            from privrelease.mechanisms.selection import expected_published_of_counts, select_by_scores

            candidates = self._candidates(loaded)
            scores = {
                name: expected_published_of_counts(merged[name][0].counts, k=self.k, beta=self.beta)
                for name in candidates
            }
            selection = select_by_scores(
                candidates, scores, k=self.k, beta=self.beta, epsilon=self.select_scheme.epsilon
            )
            merged = merged[selection.name][1]
        confidence = self.interval_confidence(loaded)
        result = partitioned.microdata(
            merged, k=self.k, beta=self.beta, epsilon=self.epsilon or 0.0, confidence=confidence
        )
        return result if selection is None else _selected(result, selection)

    def explanations(self) -> tuple[str, ...]:
        return super().explanations() + ((SELECTION,) if self.select_scheme is not None else ())


class HistogramMechanism(Generalizing):
    """Crowd-blending histogram (Gehrke et al.): counts of generalized cells, cells below k
    removed; on a Bernoulli(beta) sample when ``beta`` < 1 (default 1: no sampling). Each count
    comes with the columns ``estimate`` (count / beta) and ``lower``, ``upper``: an exact
    interval for the people behind it, given publication, at the highest ``confidence`` of the
    accuracy targets naming this mechanism (else 0.95)."""

    type: Literal["histogram"]

    label: ClassVar[str] = "crowd-blending histogram"
    output: ClassVar[Literal["microdata", "histogram"]] = "histogram"

    def run(self, loaded: LoadedPolicy, table: pa.Table) -> MechanismResult:
        from privrelease.mechanisms.histogram import crowd_blending_histogram

        return crowd_blending_histogram(
            table,
            loaded.schemes(self.columns),
            k=self.k,
            beta=self.beta,
            epsilon=self.epsilon,
            confidence=self.interval_confidence(loaded),
        )

    def finish(self, loaded: LoadedPolicy, merged: Any) -> MechanismResult:
        """Suppress the merged cells below k (each count with its estimate and interval)."""
        from privrelease.mechanisms.histogram import check_histogram, histogram_of_cells

        check_histogram(loaded.schemes(self.columns), self.k, self.beta, self.epsilon)
        confidence = self.interval_confidence(loaded)
        return histogram_of_cells(merged, k=self.k, beta=self.beta, epsilon=self.epsilon, confidence=confidence)


KINDS = (SdgsMechanism, HistogramMechanism)


def _selected(result: MechanismResult, selection: Any) -> MechanismResult:
    """``result`` released over the scheme ``selection`` chose: the selection's event first."""
    event: Event = Composed(events=(selection.event, result.event))
    return MechanismResult(
        result.table,
        event,
        {**result.public_facts, "chosen_scheme": selection.name},
        {**result.internal_facts, "selection": selection.internal_facts},
        result.cells,
    )


@dataclass(frozen=True)
class CellJob:
    """Sample with ``beta``, generalize, count cells (:func:`.sdgs.count_cells`)."""

    schemes: dict[str, ColumnScheme]
    beta: float

    def partial(self, table: pa.Table) -> Any:
        from privrelease.mechanisms.sdgs import count_cells

        return count_cells(table, self.schemes, beta=self.beta)

    def column_partial(self, rows: int) -> Any:
        """:meth:`partial` one column at a time (:class:`.sdgs.CellCounter`)."""
        from privrelease.mechanisms.sdgs import CellCounter

        return CellCounter(rows, self.schemes, beta=self.beta)

    def merge(self, parts: list[Any]) -> Any:
        """The cell counts of the whole sample (:func:`.partitioned.merge_counts`)."""
        from privrelease.mechanisms.partitioned import merge_counts

        return merge_counts(parts)


@dataclass(frozen=True)
class SelectionJob:
    """Per candidate, the cell counts of all rows (the selection's scores) and of a
    Bernoulli(beta) sample (the release, once a candidate is chosen)."""

    candidates: dict[str, dict[str, ColumnScheme]]
    beta: float

    def partial(self, table: pa.Table) -> Any:
        return by_columns(self, table)

    def column_partial(self, rows: int) -> SelectionCounters:
        """:meth:`partial` one column at a time (two :class:`.sdgs.CellCounter` per candidate)."""
        from privrelease.mechanisms.sdgs import CellCounter

        return SelectionCounters(
            {
                name: (CellCounter(rows, schemes, beta=1.0), CellCounter(rows, schemes, beta=self.beta))
                for name, schemes in self.candidates.items()
            }
        )

    def merge(self, parts: list[Any]) -> Any:
        """Per candidate, both counts of the whole table (:func:`.partitioned.merge_counts`)."""
        from privrelease.mechanisms.partitioned import merge_counts

        return {
            name: (merge_counts([part[name][0] for part in parts]), merge_counts([part[name][1] for part in parts]))
            for name in parts[0]
        }


@dataclass(frozen=True)
class SelectionCounters:
    """:meth:`SelectionJob.partial` one column at a time: per candidate, the cells of all rows
    and of a Bernoulli(beta) sample."""

    counters: dict[str, tuple[Any, Any]]

    def add(self, name: str, column: pa.ChunkedArray) -> None:
        for pair in self.counters.values():
            for counter in pair:
                counter.add(name, column)

    def result(self) -> Any:
        return {name: (every.result(), sampled.result()) for name, (every, sampled) in self.counters.items()}


SAMPLED = """<dt>k-anonymity and crowd-blending (SDGS and histograms)</dt>
<dd>Each record is first kept with probability β, independently (the sample is never published). Every kept record's values are generalized by the scheme above, fixed before the data was read (with select_scheme: one of candidates fixed so, chosen from the data by the exponential mechanism, a choice whose privacy cost is counted), and any combination of generalized values shared by fewer than k kept records is suppressed. So every published combination stands for at least k people (k-anonymity), and each person blends into a crowd of at least k ((k, 0)-crowd-blending privacy). Neither property alone is differential privacy: the secret random sample (β &lt; 1) is what makes the release (ε, δ)-differentially private (Li, Qardaji, Su, Theorem 1). A histogram with its cells under k removed reveals no more than the microdata and is accounted the same way.</dd>"""

KDGS = """<dt>k-DGS without sampling is not differential privacy</dt>
<dd>A release with β = 1 (generalization and suppression of the full data, k-DGS) is k-anonymous and crowd-blending private but has <strong>no (ε, δ)-differential-privacy guarantee</strong> for any δ &lt; 1 (Li, Qardaji, Su, Proposition 4): removing one person can visibly change a published count.</dd>"""

SELECTION = """<dt>Choosing the generalization</dt>
<dd>The generalization scheme was chosen among the candidates the policy lists by the exponential mechanism, itself ε-differentially private; its ε is part of the composed guarantee.</dd>"""
