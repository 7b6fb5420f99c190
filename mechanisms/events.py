"""Privacy events: immutable, JSON-serializable descriptions of what a mechanism releases.

An event is data only (after Google's ``dp_accounting.DpEvent``). Accountants
(:mod:`privrelease.mechanisms.accountants`) turn an event tree into guarantees; the plan, the
ledger, the audit record and the report all store and replay the same tree. Events are
versioned by ``EVENT_SCHEMA_VERSION`` and never reinterpreted: a change of meaning is a new kind.

>>> tree = Composed(events=(SDGS(k=20, beta=0.1, epsilon=1.0), SPLUGen(gamma=5)))
>>> event_from_json(event_to_json(tree)) == tree
True
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

EVENT_SCHEMA_VERSION = 1


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SDGS(_Event):
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


class Laplace(_Event):
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


class ExponentialSelection(_Event):
    """The exponential mechanism choosing one of ``candidates`` generalization schemes with a
    utility score of sensitivity ``sensitivity`` (eps-safe k-anonymization, Li-Qardaji-Su
    "On sampling, anonymization, and differential privacy", Section 3.2): pure epsilon-DP."""

    kind: Literal["exponential_selection"] = "exponential_selection"
    epsilon: float = Field(gt=0)
    candidates: int = Field(ge=1)
    sensitivity: float = Field(gt=0)


class SPLUGen(_Event):
    """SPLU-Gen (Fu et al., Section 3): decoy groups of size gamma, each sensitive value replaced
    by a uniformly chosen decoy. Gives small-sum privacy / large-sum utility, never DP."""

    kind: Literal["splu_gen"] = "splu_gen"
    gamma: int = Field(ge=2)
    sensitive: tuple[str, ...] = ()


class Sampled(_Event):
    """``event`` run on a Bernoulli(beta) sample (amplification: Li-Qardaji-Su Corollary 4)."""

    kind: Literal["sampled"] = "sampled"
    beta: float = Field(gt=0, le=1)
    event: Event


class Composed(_Event):
    """Sequential composition: every child event is released (about the same people)."""

    kind: Literal["composed"] = "composed"
    events: tuple[Event, ...]


Event = Annotated[
    SDGS | Laplace | ExponentialSelection | SPLUGen | Sampled | Composed,
    Field(discriminator="kind"),
]
Sampled.model_rebuild()
Composed.model_rebuild()

_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def event_to_json(event: _Event) -> str:
    """Canonical JSON of an event tree (sorted keys, no whitespace), with the schema version."""
    body = {"schema_version": EVENT_SCHEMA_VERSION, "event": event.model_dump(mode="json")}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def event_from_json(text: str) -> Event:
    """Parse :func:`event_to_json` output; refuses a schema version this code does not know."""
    body = json.loads(text)
    if body.get("schema_version") != EVENT_SCHEMA_VERSION:
        raise ValueError(f"event schema_version must be {EVENT_SCHEMA_VERSION}; got {body.get('schema_version')!r}")
    return _ADAPTER.validate_python(body["event"])


def leaves(event: Event) -> list[Event]:
    """The non-composed events of a tree, in order."""
    if isinstance(event, Composed):
        return [leaf for child in event.events for leaf in leaves(child)]
    return [event]


def leaf_counts(events: Iterable[Event] | Mapping[Event, int]) -> Counter[Event]:
    """How many times each non-composed event occurs in ``events``: event trees, or trees with
    a multiplicity each (identical trees are flattened once)."""
    trees = Counter(events) if not isinstance(events, Mapping) else events
    found: Counter[Event] = Counter()
    for tree, count in trees.items():
        for leaf in leaves(tree):
            found[leaf] += count
    return found
