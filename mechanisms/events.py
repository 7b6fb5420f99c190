"""Privacy events: immutable, JSON-serializable descriptions of what a mechanism releases,
each carrying its privacy map.

An event is data (after Google's ``dp_accounting.DpEvent``) plus the rules that bound it:
:meth:`Event.guarantee` (its (epsilon, delta) under each notion of
:mod:`~privrelease.mechanisms.guarantees`), :meth:`Event.pld` (its privacy loss distribution,
for tight composition) and :meth:`Event.exact_curve` (its exact hockey-stick curve, when known).
The accountants (:mod:`.accountants`, :mod:`.composition`) combine them through
:class:`Sampled` and :class:`Composed`; the plan, the ledger, the audit record and the report
all store and replay the same tree. A mechanism kind may define events of its own in its
module (:mod:`privrelease.mechanisms.kinds`): every subclass is registered by its ``kind``.
Events are versioned by ``EVENT_SCHEMA_VERSION`` and never reinterpreted: a change of
meaning is a new kind.

>>> tree = Composed(events=(SDGS(k=20, beta=0.1, epsilon=1.0), SPLUGen(gamma=5)))
>>> event_from_json(event_to_json(tree)) == tree
True
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny, model_serializer

from privrelease.errors import UserError
from privrelease.mechanisms.guarantees import Guarantee, Notion, Unsupported, pure, unsupported

EVENT_SCHEMA_VERSION = 1

_U = 2.0**-52

_CLASSES: dict[str, type[Event]] = {}

ROW = "row"
"""The neighbouring relation of a release whose policy names no person column: add or remove one
row (each row is taken to be a different person)."""

PERSON = "person:"
"""The prefix of a person-level relation, ``person:<column>``: add or remove one person, every
row with the same value of ``<column>`` (at most the policy's ``max_rows`` of them are kept, at
random, before any mechanism runs, so the mechanism's sensitivity bounds a whole person)."""


class Event(BaseModel):
    """A release about the people of one dataset. Subclasses set ``kind`` (a ``Literal`` with
    that default) and override the privacy map; the defaults fail closed. ``neighbours``: the
    neighbouring relation its guarantee is for (:data:`ROW`, or :data:`PERSON` and a column),
    left out of the JSON when it is :data:`ROW`, so trees stored before it existed replay
    unchanged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    neighbours: str = ROW
    omitted_at_default: ClassVar[dict[str, Any]] = {"neighbours": ROW}
    """Fields left out of the JSON at these values (added after trees were stored)."""

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: Any) -> Any:
        body = handler(self)
        for name, default in self.omitted_at_default.items():
            if body.get(name) == default:
                del body[name]
        return body

    differentially_private: ClassVar[bool] = True
    """Whether the release claims (epsilon, delta)-DP (then it is checked against the policy's
    DP targets and charged to the lifetime budget, even when unsupported). Default True: a new
    event is held to DP until it says otherwise."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        kind = cls.model_fields["kind"].default
        assert isinstance(kind, str), f"{cls.__name__} must give kind a default (its tag)"
        assert _CLASSES.get(kind, cls).__qualname__ == cls.__qualname__, f"two events are named {kind!r}"
        _CLASSES[kind] = cls

    def guarantee(self, notion: Notion) -> Guarantee:
        """Its (epsilon, delta) under ``notion``."""
        return unsupported(notion, f"no privacy map for a {self.kind} event")

    def pld(self, discretization: float) -> Any:
        """A privacy loss distribution (``dp_accounting``) dominating it for every pair of
        neighbours; :class:`Unsupported` when there is none."""
        raise Unsupported(f"no privacy loss distribution for a {self.kind} event (not differentially private)")

    def exact_curve(self) -> Callable[[float], float] | None:
        """Its exact hockey-stick delta as a function of epsilon (rounded up), when known."""
        return None

    def renyi(self, orders: Any) -> Any:
        """Upper bounds of its Rényi divergences at ``orders`` (a numpy array of orders > 1),
        both neighbour directions, in closed form when known; None: :mod:`.renyi` takes them
        from :meth:`pld`."""
        return None

    def noun(self) -> str:
        """What it releases, in a few words (how a composition names its parts: :func:`counted`)."""
        return self.kind.replace("_", " ")


def event_class(kind: str) -> type[Event]:
    """The event class tagged ``kind``, the mechanism kinds' own included."""
    if kind not in _CLASSES:
        from privrelease.mechanisms.kinds import all_kinds

        all_kinds()  # importing the kinds registers their events
    if kind not in _CLASSES:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(sorted(_CLASSES))}")
    return _CLASSES[kind]


def _as_event(value: Any) -> Any:
    if isinstance(value, Mapping) and not isinstance(value, Event):
        return event_class(str(value.get("kind"))).model_validate(value)
    return value


AnyEvent = Annotated[SerializeAsAny[Event], BeforeValidator(_as_event)]
"""A field holding any registered event (parsed by its ``kind`` tag)."""


class SDGS(Event):
    """(k, beta)-SDGS (Li, Qardaji, Su, Algorithm 4): Bernoulli(beta) sampling, data-independent
    generalization, suppression of generalized values occurring fewer than k times.

    ``beta = 1`` is k-DGS (Algorithm 3, no sampling). ``output`` says whether the rows or only the
    counts per cell are published; a crowd-blending histogram with cells below k removed releases
    the same information as SDGS microdata and is accounted identically. ``epsilon`` is the
    epsilon at which the release states its guarantee (delta = d(k, beta, epsilon)).
    """

    kind: Literal["sdgs"] = "sdgs"
    k: int = Field(ge=1)
    beta: float = Field(gt=0, le=1)
    epsilon: float = Field(ge=0)
    output: Literal["microdata", "histogram"] = "microdata"

    def noun(self) -> str:
        return f"SDGS {self.output}"

    def _not_sampled(self, notion: str) -> Guarantee:
        return unsupported(
            notion,
            f"k-DGS without sampling (beta = 1): k-anonymity and ({self.k}, 0)-crowd-blending "
            "privacy only; no (eps, delta)-DP for any delta < 1 (Li-Qardaji-Su Proposition 4)",
        )

    def guarantee(self, notion: Notion) -> Guarantee:
        """Probabilistic: Theorem 1's d(k, beta, eps); approximate: the exact hockey-stick delta."""
        from privrelease.mechanisms.sdgs_math import delta_exact, delta_theorem1

        if self.beta >= 1:
            return self._not_sampled(notion)
        if notion == "probabilistic":
            result = delta_theorem1(self.k, self.beta, self.epsilon)
            if result.delta is None:
                return unsupported(notion, result.reason)
            detail = f"Theorem 1: d(k={self.k}, beta={self.beta:g}, eps={self.epsilon:g}), max at n = {result.argmax_n}"
            return Guarantee(notion, self.epsilon, result.delta, True, detail)
        exact = delta_exact(self.k, self.beta, self.epsilon)
        assert exact.delta is not None
        return Guarantee(
            notion, self.epsilon, exact.delta, True, f"exact hockey-stick delta, max at n = {exact.argmax_n}"
        )

    def pld(self, discretization: float) -> Any:
        """The connect-the-dots pair above its exact profile (:func:`.pld.sdgs_pld`)."""
        from privrelease.mechanisms.pld import sdgs_pld

        if self.beta >= 1:
            raise Unsupported(self._not_sampled("approximate").detail)
        return sdgs_pld(self.k, self.beta, discretization)

    def exact_curve(self) -> Callable[[float], float] | None:
        """:func:`~privrelease.mechanisms.sdgs_math.delta_exact`, the supremum over cell sizes."""
        from privrelease.mechanisms.sdgs_math import delta_exact

        k, beta = self.k, self.beta
        return None if beta >= 1 else lambda epsilon: float(delta_exact(k, beta, epsilon).delta)  # type: ignore[arg-type]


class Laplace(Event):
    """Laplace noise of scale ``scale`` on a query whose global sensitivity under
    add/remove-one-row neighbours (the notion every DP accountant here uses) is ``sensitivity``
    (epsilon = sensitivity / scale). For rho-differential identifiability (Lee & Clifton) the
    event also records the universe size m and the sensitive range S(f) it was calibrated with.
    Disjoint groups of a grouped statistic are one event (parallel composition)."""

    kind: Literal["laplace"] = "laplace"
    scale: float = Field(gt=0)
    sensitivity: float = Field(gt=0)
    sensitive_range: float | None = Field(default=None, gt=0)
    universe_size: int | None = Field(default=None, ge=2)

    def noun(self) -> str:
        return "Laplace noise"

    def guarantee(self, notion: Notion) -> Guarantee:
        return pure(
            notion, self.sensitivity / self.scale, f"Laplace(scale {self.scale:.6g}), sensitivity {self.sensitivity:g}"
        )

    def pld(self, discretization: float) -> Any:
        """dp_accounting's own pessimistic Laplace PLD."""
        from dp_accounting.pld import privacy_loss_distribution as pld

        return pld.from_laplace_mechanism(
            self.scale, sensitivity=self.sensitivity, value_discretization_interval=discretization
        )


class ExponentialSelection(Event):
    """The exponential mechanism choosing one of ``candidates`` generalization schemes with a
    utility score of sensitivity ``sensitivity`` (eps-safe k-anonymization, Li-Qardaji-Su
    "On sampling, anonymization, and differential privacy", Section 3.2): pure epsilon-DP."""

    kind: Literal["exponential_selection"] = "exponential_selection"
    epsilon: float = Field(gt=0)
    candidates: int = Field(ge=1)
    sensitivity: float = Field(gt=0)

    def noun(self) -> str:
        return "scheme selection"

    def guarantee(self, notion: Notion) -> Guarantee:
        return pure(notion, self.epsilon, f"exponential mechanism over {self.candidates} schemes")

    def pld(self, discretization: float) -> Any:
        from privrelease.mechanisms.pld import pure_dp_pld

        return pure_dp_pld(self.epsilon, discretization)


class BoundedRangeSelection(ExponentialSelection):
    """The same exponential-mechanism selection, accounted by its bounded range (a kind of its
    own, so that stored ``exponential_selection`` trees replay as they were recorded).

    For neighbours D, D' (either order) the loss ln Pr_D[S] / Pr_D'[S] of the monotone-score
    mechanism (:mod:`.selection`) is ``epsilon (u_S - u'_S) / Delta + ln(Z_D' / Z_D)``, the first
    term in ``[0, epsilon]`` or ``[-epsilon, 0]`` for every S and the second the same for all S: the
    losses lie in ``[t - epsilon, t]`` for one ``t`` in ``[0, epsilon]`` (epsilon-bounded range;
    Durfee-Rogers, "Practical differentially private top-k selection", NeurIPS 2019; the factor-2
    mechanism of any score too). Such a pair is a post-processing of the two-point pair with losses
    ``t`` and ``t - epsilon`` (each (P(o), Q(o)) is a nonnegative combination of (e^t, 1) and
    (e^(t - epsilon), 1)), which puts ``p_t = (e^epsilon - e^t) / (e^epsilon - 1)`` on loss ``t``;
    its delta at ``eps' < t`` is ``p_t (1 - e^(eps' - t))``, largest at ``t = (epsilon + eps') / 2``:

        delta(eps') = (1 - e^((eps' - epsilon) / 2))^2 / (1 - e^(-epsilon)),  0 for eps' >= epsilon

    (Dong, Durfee, Rogers, "Optimal differential privacy composition for exponential
    mechanisms", ICML 2020). Two candidates reach it (every ``t`` occurs), so it is exact; it is
    ``tanh(epsilon / 4)`` at 0, where the pure-DP pair gives ``tanh(epsilon / 2)``. The family is
    closed under swapping the neighbours (``t -> epsilon - t``), so the connect-the-dots pair above
    it (:func:`.pld.profile_pld`) dominates every release in both directions."""

    kind: Literal["bounded_range_selection"] = "bounded_range_selection"  # type: ignore[assignment]

    def exact_curve(self) -> Callable[[float], float] | None:
        return functools.partial(bounded_range_delta, self.epsilon)

    def pld(self, discretization: float) -> Any:
        from privrelease.mechanisms.pld import profile_pld

        return profile_pld(self.exact_curve(), self.epsilon, discretization)  # type: ignore[arg-type]

    def renyi(self, orders: Any) -> Any:
        """The smaller of ``a epsilon^2 / 8`` (epsilon-bounded range is ``epsilon^2 / 8``-zCDP:
        Cesar, Rogers, "Bounding, concentrating, and truncating: unifying privacy loss composition
        for data analytics", ALT 2021; checked against the exact divergences in the tests) and
        the divergences of its PLD (:func:`.pld.divergences`; it has no infinite loss)."""
        import numpy as np

        from privrelease.mechanisms.pld import DISCRETIZATION, divergences

        return np.minimum(orders * self.epsilon**2 / 8, divergences(self.pld(DISCRETIZATION), orders)[0])


def bounded_range_delta(width: float, epsilon: float) -> float:
    """:class:`BoundedRangeSelection`'s exact delta at ``epsilon`` for range ``width``, rounded up."""
    if epsilon >= width:
        return 0.0
    return min(1.0, math.expm1((epsilon - width) / 2) ** 2 / -math.expm1(-width) * (1 + 16 * _U))


class SPLUGen(Event):
    """SPLU-Gen (Fu et al., Section 3): decoy groups of size gamma, each sensitive value replaced
    by a uniformly chosen decoy. Gives small-sum privacy / large-sum utility, never DP."""

    kind: Literal["splu_gen"] = "splu_gen"
    gamma: int = Field(ge=2)
    sensitive: tuple[str, ...] = ()
    differentially_private: ClassVar[bool] = False

    def noun(self) -> str:
        return "SPLU-Gen"

    def guarantee(self, notion: Notion) -> Guarantee:
        return unsupported(
            notion,
            f"SPLU-Gen (gamma = {self.gamma}) gives small-sum privacy and large-sum utility, not differential privacy",
        )


class Sampled(Event):
    """``event`` run on a Bernoulli(beta) sample (amplification: Li-Qardaji-Su Corollary 4)."""

    kind: Literal["sampled"] = "sampled"
    beta: float = Field(gt=0, le=1)
    event: AnyEvent

    @property
    def differentially_private(self) -> bool:  # type: ignore[override]
        return is_dp(self.event)

    def noun(self) -> str:
        return f"{self.event.noun()} on a {self.beta:g}-sample"


class Composed(Event):
    """Sequential composition: every child event is released (about the same people)."""

    kind: Literal["composed"] = "composed"
    events: tuple[AnyEvent, ...]


class UnknownEventKind(UserError):
    """A stored event tree names an event kind no installed code defines (a plugin's, since
    uninstalled): it cannot be replayed or composed here. ``recorded``: the tree names the
    distribution defining every such kind (what to install)."""

    def __init__(self, message: str, *, recorded: bool) -> None:
        super().__init__(message)
        self.recorded = recorded


def event_to_json(event: Event) -> str:
    """Canonical JSON of an event tree (sorted keys, no whitespace), with the schema version and,
    when the tree holds events of plugin kinds, ``defined_by``: each such kind's distribution and
    version (what to install to replay it; :func:`~privrelease.mechanisms.kinds.defined_by`)."""
    body: dict[str, Any] = {"schema_version": EVENT_SCHEMA_VERSION, "event": event.model_dump(mode="json")}
    plugins = _defined_by(event)
    if plugins:
        body["defined_by"] = plugins
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _defined_by(event: Event) -> dict[str, dict[str, str]]:
    """Event kind -> its plugin distribution, for every node of the tree a plugin defines."""
    from privrelease.mechanisms.kinds import defined_by

    nodes = [event]
    found: dict[str, dict[str, str]] = {}
    while nodes:
        node = nodes.pop()
        values = [item for value in vars(node).values() for item in (value if isinstance(value, tuple) else (value,))]
        nodes += [value for value in values if isinstance(value, Event)]
        shipped = defined_by(type(node))
        if shipped is not None:
            found[node.kind] = shipped.as_dict()
    return found


def _kinds_in(value: Any) -> set[str]:
    """Every ``kind`` tag of a JSON event tree."""
    if isinstance(value, Mapping):
        own = {str(value["kind"])} if "kind" in value else set()
        return own.union(*(_kinds_in(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(_kinds_in(item) for item in value))
    return set()


def event_from_json(text: str) -> Event:
    """Parse :func:`event_to_json` output; refuses a schema version this code does not know, and
    names what to install (:class:`UnknownEventKind`) for a kind no installed code defines."""
    body = json.loads(text)
    if body.get("schema_version") != EVENT_SCHEMA_VERSION:
        raise ValueError(f"event schema_version must be {EVENT_SCHEMA_VERSION}; got {body.get('schema_version')!r}")
    missing = sorted(_kinds_in(body["event"]) - set(_CLASSES))
    if missing:
        from privrelease.mechanisms.kinds import all_kinds

        all_kinds()  # importing the kinds registers their events
        missing = sorted(kind for kind in missing if kind not in _CLASSES)
    if missing:
        recorded = body.get("defined_by") or {}
        needed = {kind: _installable(recorded.get(kind)) for kind in missing}
        raise UnknownEventKind(
            f"cannot replay event kind{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}: "
            f"no installed code defines {'them' if len(missing) > 1 else 'it'}; "
            f"install {' and '.join(sorted({what for what in needed.values() if what}) or [UNRECORDED])}",
            recorded=all(needed.values()),
        )
    event = _as_event(body["event"])
    assert isinstance(event, Event)
    return event


UNRECORDED = (
    "the plugin that defined it (its tree does not record which: unknown, or stored before privrelease recorded it)"
)


def _installable(recorded: Any) -> str:
    """What to install for a kind, as its stored tree's ``defined_by`` records it ("" when it
    does not)."""
    if isinstance(recorded, Mapping) and recorded.get("distribution") and recorded.get("version"):
        return f"{recorded['distribution']}=={recorded['version']}"
    return ""


def person_level(event: Event, relation: str) -> Event:
    """The tree with every release under the neighbouring ``relation`` (composed nodes are only
    structure; a sampled release and the release it samples both carry it)."""
    if isinstance(event, Composed):
        return event.model_copy(update={"events": tuple(person_level(child, relation) for child in event.events)})
    if isinstance(event, Sampled):
        return event.model_copy(update={"event": person_level(event.event, relation), "neighbours": relation})
    return event.model_copy(update={"neighbours": relation})


def relation_of(events: Iterable[Event]) -> str:
    """The one neighbouring relation of the releases ``events`` (:data:`ROW` when there are none);
    a :class:`UserError` when they mix relations: a guarantee for one row says nothing about a
    person with several rows (nor one person column about another), so they do not compose."""
    found = sorted({leaf.neighbours for event in events for leaf in leaves(event)})
    if len(found) > 1:
        raise UserError(
            "cannot compose releases under different neighbouring relations: "
            + " and ".join(describe_relation(relation) for relation in found)
            + "; a guarantee for one row says nothing about a person with several rows: "
            "keep each unit of privacy on its own dataset.id"
        )
    return found[0] if found else ROW


def describe_relation(relation: str) -> str:
    """``relation`` in words."""
    if relation.startswith(PERSON):
        return f"add or remove one person (every row with the same {relation.removeprefix(PERSON)})"
    return "add or remove one row (each row taken to be a different person)"


def leaves(event: Event) -> list[Event]:
    """The non-composed events of a tree, in order."""
    if isinstance(event, Composed):
        return [leaf for child in event.events for leaf in leaves(child)]
    return [event]


def counted(events: Iterable[Event] | Mapping[Event, int]) -> str:
    """How many releases ``events`` compose (event trees, or a multiset of releases:
    :func:`leaf_counts`) and what they are, e.g. "2 releases (scheme selection, SDGS
    microdata)"; a kind released several times is named once with its count ("Laplace noise
    x12"). One policy mechanism may be several releases (a scheme selection before its SDGS)."""
    names: Counter[str] = Counter()
    for leaf, times in leaf_counts(events).items():
        names[leaf.noun()] += times
    total = sum(names.values())
    parts = ", ".join(name if times == 1 else f"{name} x{times}" for name, times in names.items())
    return f"{total} release{'s' * (total != 1)} ({parts})"


def is_dp(event: Event) -> bool:
    """Whether every release of the tree claims differential privacy (the one place that
    decides which releases the DP targets and the lifetime budget govern)."""
    return all(leaf.differentially_private for leaf in leaves(event))


def leaf_counts(events: Iterable[Event] | Mapping[Event, int]) -> Counter[Event]:
    """How many times each non-composed event occurs in ``events``: event trees, or trees with
    a multiplicity each (identical trees are flattened once)."""
    trees = Counter(events) if not isinstance(events, Mapping) else events
    found: Counter[Event] = Counter()
    for tree, count in trees.items():
        for leaf in leaves(tree):
            found[leaf] += count
    return found
