"""What the facts of a plan or a run are called wherever people read them (the report, the
disclosure statement, ``privrelease plan``): one table, so every place says the same words and
none shows a raw key such as ``t_p``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FACT_LABELS = {
    "k_anonymity": "k-anonymity",
    "crowd_blending": "crowd-blending",
    "candidate_schemes": "candidate schemes",
    "query": "query",
    "column": "column",
    "rho": "target ρ",
    "rho_achieved": "ρ achieved",
    "feasible": "ρ feasible",
    "lambda": "Laplace scale λ",
    "universe_size": "universe size m",
    "sensitive_range": "sensitive range S(f)",
    "reason": "note",
    "fsmooth": "f-smooth (Theorem 6)",
    "model": "privacy model",
    "t_p": "small-sum privacy T_p",
    "t_p_argmin_f": "T_p attained at f",
    "t_f": "large-sum utility T_f",
    "approximate_delta_at_max_epsilon": "approximate δ at the target max ε",
    "composition": "composition (every method compared, the tightest used)",
    "rho_composed_statistics": "ρ of the statistics composed",
    "not_dp": "not differential privacy",
    "zcdp_rho": "zCDP ρ of the Gaussian noise for one person: Δ²/(2σ²) summed over its noisy measurements, Δ the L2 "
    "change one person makes to each (zero-concentrated DP, Bun & Steinke; not the identifiability ρ)",
}
INTERNAL_FACT_LABELS = {
    "rows_dropped_by_person_bound": "rows dropped by the person bound (dataset.person max_rows)",
    "discernibility": "discernibility (Bayardo & Agrawal: the sum of the published classes' squared sizes plus "
    "suppressed × sampled rows; lower means less information lost)",
}
FACT_KEYS = {"epsilon0": "ε0", "delta0": "δ0"}
"""Labels of the keys inside a fact that is a mapping (e.g. an f-smooth bound's)."""


def fact_label(key: str) -> str:
    """A public fact's label (:data:`FACT_LABELS`; else its key with spaces)."""
    return FACT_LABELS.get(key, key.replace("_", " "))


def internal_fact_label(key: str) -> str:
    """An internal fact's label (:data:`INTERNAL_FACT_LABELS`; else its key with spaces)."""
    return INTERNAL_FACT_LABELS.get(key, key.replace("_", " "))


def fact_text(value: Any, number: Callable[[float], str]) -> str:
    """A fact or parameter in words, the same in ``plan`` and the report: yes/no, ``number`` for
    floats, lists joined, a list of lists (column groups, e.g. noisy tables) as
    ``[a, b]; [c]; [] (total)``, mappings as ``key = value`` (a nested one as ``key (...)``, keys
    labelled by :data:`FACT_KEYS`), ``none`` for a missing value."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, (list, tuple)) for item in value):
        return "; ".join(f"[{fact_text(group, number)}]" if group else "[] (total)" for group in value)
    if isinstance(value, (list, tuple)):
        return ", ".join(fact_text(item, number) for item in value)
    if isinstance(value, dict):  # a mapping of mappings (noisy tables' levels): "state (of = county, level = 1)"
        return ", ".join(
            f"{FACT_KEYS.get(key, key)} ({fact_text(item, number)})"
            if isinstance(item, dict)
            else f"{FACT_KEYS.get(key, key)} = {fact_text(item, number)}"
            for key, item in value.items()
        )
    if value is None:
        return "none"
    return str(value)


def composed(result: dict[str, Any]) -> str:
    """What a composition's facts compose: its releases named (``composed``), or, in facts
    stored before they were, their number."""
    releases = result["releases"]
    return result.get("composed") or f"{releases} release{'s' * (releases != 1)}"
