"""A synthetic hospital discharge file: patients with 1 to 12 discharges each, deterministic given
a seed (the same bytes on every machine: integers only, written by hand, no float formatting).

    python tools/discharges.py PATH [--patients N] [--seed S]

Each patient has a county and an age group; each discharge a diagnosis (the patient's usual
one with probability 0.6), a length of stay and charges. The skew is unequal on purpose:
discharges per patient P(k) ∝ 0.6^(k - 1) on 1..12 (most patients once, a few a dozen times),
counties and diagnoses of unequal size, stays by diagnosis and age (a longer tail for the old),
charges a daily rate by diagnosis times the stay times a log-normal factor, a few far above any
sensible clamping bound. ``policies/examples/data/discharges.csv`` is
``python tools/discharges.py policies/examples/data/discharges.csv`` (a test checks the bytes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

COUNTIES = ("Alder", "Birch", "Cedar", "Dogwood", "Elm")
COUNTY_WEIGHTS = (0.40, 0.26, 0.17, 0.11, 0.06)
DIAGNOSES = ("circulatory", "respiratory", "digestive", "injury", "mental")
DIAGNOSIS_WEIGHTS = (0.30, 0.24, 0.20, 0.16, 0.10)
DAILY_RATE = (3200, 2600, 2300, 2900, 1400)
"""Charges per day of stay, by diagnosis (dollars)."""
AGE_GROUPS = ("0-17", "18-44", "45-64", "65+")
AGE_WEIGHTS = (0.12, 0.28, 0.30, 0.30)
MAX_DISCHARGES = 12
COLUMNS = ("patient_id", "county", "age_group", "diagnosis", "length_of_stay", "charges")
PATIENTS = 3000
SEED = 2027


def _choice(rng: np.random.Generator, weights: tuple[float, ...], size: int) -> np.ndarray:
    """Indices drawn with ``weights`` (normalized), by inverse CDF over uniforms: the same
    integers for the same seed whatever numpy's ``choice`` does."""
    cdf = np.cumsum(weights) / sum(weights)
    return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), len(weights) - 1)


def discharges(patients: int = PATIENTS, seed: int = SEED) -> dict[str, np.ndarray]:
    """The file's columns (integer codes and values), rows in a seeded random order."""
    rng = np.random.default_rng(seed)
    per_patient = 1 + _choice(rng, tuple(0.6**k for k in range(MAX_DISCHARGES)), patients)
    county = _choice(rng, COUNTY_WEIGHTS, patients)
    age = _choice(rng, AGE_WEIGHTS, patients)
    usual = _choice(rng, DIAGNOSIS_WEIGHTS, patients)
    patient = np.repeat(np.arange(patients), per_patient)
    rows = patient.size
    other = _choice(rng, DIAGNOSIS_WEIGHTS, rows)
    diagnosis = np.where(rng.random(rows) < 0.6, usual[patient], other)
    mean_stay = 2.0 + 1.5 * age[patient] + np.array([2.0, 1.5, 1.0, 2.5, 6.0])[diagnosis]
    stay = 1 + rng.poisson(mean_stay)
    factor = np.exp(rng.normal(0.0, 0.5, rows)) * np.where(rng.random(rows) < 0.02, 8.0, 1.0)
    charges = np.rint(np.array(DAILY_RATE)[diagnosis] * stay * factor).astype(np.int64)
    order = rng.permutation(rows)
    ids = 100000 + rng.permutation(patients)  # identifiers unrelated to the order above
    return {
        "patient_id": ids[patient][order],
        "county": county[patient][order],
        "age_group": age[patient][order],
        "diagnosis": diagnosis[order],
        "length_of_stay": stay[order],
        "charges": charges[order],
    }


def write(path: Path, patients: int = PATIENTS, seed: int = SEED) -> int:
    """Write the CSV (comma-separated, a header row) to ``path``; return its number of rows."""
    data = discharges(patients, seed)
    names = {"county": COUNTIES, "age_group": AGE_GROUPS, "diagnosis": DIAGNOSES}
    text = [",".join(COLUMNS)]
    for row in zip(*(data[column].tolist() for column in COLUMNS), strict=True):
        text.append(",".join(str(names[c][v]) if c in names else str(v) for c, v in zip(COLUMNS, row, strict=True)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return len(text) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--patients", type=int, default=PATIENTS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    print(f"{write(args.path, args.patients, args.seed)} discharges written to {args.path}")


if __name__ == "__main__":
    main()
