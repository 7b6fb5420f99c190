"""A SYNTHETIC geography for the ``noisy_tables`` example (policies/examples/geo-tables.yaml):
counties in states of unequal sizes, and people in them. Deterministic given the seed.

    python tools/geo_tables.py --out policies/examples            # geo-counties.csv, geo-people.csv

``geo-counties.csv``: the public hierarchy, an ARX hierarchy CSV ``county;state;*`` (one row per
county; committed with the example). ``geo-people.csv``: one row per person, ``county;age;sex``
(``--rows``, default 200,000; not committed: generate it). States get ``1 + Multinomial(counties
- states, w)`` counties (``w`` log-normal: from a handful to a few hundred counties each), counties a
log-normal share of the people, so many counties are small.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

STATES = 50
COUNTIES = 3000
AGES = ("0-17", "18-34", "35-64", "65+")
AGE_SHARES = (0.22, 0.23, 0.38, 0.17)
SEXES = ("F", "M")
SEED = 26
HIERARCHY_FILE = "geo-counties.csv"
PEOPLE_FILE = "geo-people.csv"


def counties(seed: int = SEED) -> list[tuple[str, str]]:
    """(county, state) of every county, counties numbered within their state."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(0.0, 0.6, STATES)
    per_state = 1 + rng.multinomial(COUNTIES - STATES, weights / weights.sum())
    return [(f"S{s + 1:02d}-C{c + 1:03d}", f"S{s + 1:02d}") for s, count in enumerate(per_state) for c in range(count)]


def people(rows: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """County index, age group index and sex index of ``rows`` people."""
    rng = np.random.default_rng([seed, 1])
    share = rng.lognormal(0.0, 1.5, COUNTIES)
    county = rng.choice(COUNTIES, size=rows, p=share / share.sum())
    age = rng.choice(len(AGES), size=rows, p=AGE_SHARES)
    sex = rng.integers(0, len(SEXES), size=rows)
    return county, age, sex


def write(out: Path, rows: int = 200_000, seed: int = SEED) -> tuple[Path, Path]:
    """Write the hierarchy and the people into folder ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    places = counties(seed)
    hierarchy = out / HIERARCHY_FILE
    with hierarchy.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle, delimiter=";", lineterminator="\n").writerows((c, s, "*") for c, s in places)
    county, age, sex = people(rows, seed)
    names = np.array([c for c, _ in places])
    target = out / PEOPLE_FILE
    with target.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=";", lineterminator="\n")
        writer.writerow(("county", "age", "sex"))
        writer.writerows(zip(names[county], np.array(AGES)[age], np.array(SEXES)[sex], strict=True))
    return hierarchy, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("policies/examples"), help="folder to write into")
    parser.add_argument("--rows", type=int, default=200_000, help="people (rows) to generate")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    for path in write(args.out, args.rows, args.seed):
        print(path)


if __name__ == "__main__":
    main()
