"""SYNTHETIC census-like test data for ``privrelease demo`` (no real person is in it).

:func:`generate` draws ``rows`` people with exactly the columns and values that
``policies/examples/demo.yaml`` declares, vectorized with numpy:

============== ==============================================================================
age            17..90: 17 + Gamma(shape 2.2, scale 9.5), rounded, capped at 90
sex            Male 0.51, Female 0.49
race           White 0.82, Black 0.10, Asian-Pac-Islander 0.04, Amer-Indian-Eskimo 0.01,
               Other 0.03
marital-status by age band (17-24, 25-44, 45+), frequencies in :data:`MARITAL`
education      16 levels, Adult-like frequencies (:data:`EDUCATION`)
occupation     by education group (no diploma / high school / college / graduate)
hours-per-week 1..99: 45% exactly 40, else Normal(40, 12) rounded and clipped
salary-class   ">50K" with probability logistic(-9.0 + 0.35 * years of school + 0.04 * (age
               capped at 60) + 0.03 * hours + 0.4 * [Male])
============== ==============================================================================

It is test data, not a mechanism, so it may use a seeded PRNG: ``seed=None`` (the default)
seeds numpy's PCG64 from the OS CSPRNG (``numpy.random.default_rng()``); a fixed ``seed`` (e.g.
``privrelease demo --seed 2024``) gives the same file every time. The file name says SYNTHETIC
and a note file beside it says how it was made.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from privrelease.errors import UserError
from privrelease.files import write_atomic

DATA_FILE = "demo-census-SYNTHETIC.csv"
"""The generated data's file name (the copied demo policy points its ``dataset.path`` here)."""
NOTE_FILE = "SYNTHETIC-DATA-README.txt"
POLICY_FILE = "demo.yaml"
ROWS = 50_000

SEX = (("Male", 0.51), ("Female", 0.49))
RACE = (
    ("White", 0.82),
    ("Black", 0.10),
    ("Asian-Pac-Islander", 0.04),
    ("Amer-Indian-Eskimo", 0.01),
    ("Other", 0.03),
)
MARITAL_VALUES = (
    "Married-civ-spouse",
    "Never-married",
    "Divorced",
    "Separated",
    "Widowed",
    "Married-spouse-absent",
    "Married-AF-spouse",
)
MARITAL = {  # age band -> frequencies of MARITAL_VALUES
    "17-24": (0.08, 0.88, 0.02, 0.01, 0.0, 0.008, 0.002),
    "25-44": (0.50, 0.30, 0.12, 0.04, 0.01, 0.028, 0.002),
    "45+": (0.60, 0.08, 0.17, 0.03, 0.10, 0.019, 0.001),
}
EDUCATION = (  # value, frequency, years of school
    ("Preschool", 0.002, 1),
    ("1st-4th", 0.005, 3),
    ("5th-6th", 0.010, 6),
    ("7th-8th", 0.020, 8),
    ("9th", 0.016, 9),
    ("10th", 0.028, 10),
    ("11th", 0.036, 11),
    ("12th", 0.013, 12),
    ("HS-grad", 0.323, 12),
    ("Some-college", 0.222, 13),
    ("Assoc-voc", 0.042, 14),
    ("Assoc-acdm", 0.033, 14),
    ("Bachelors", 0.165, 16),
    ("Masters", 0.054, 18),
    ("Prof-school", 0.018, 19),
    ("Doctorate", 0.013, 20),
)
OCCUPATION_VALUES = (
    "Tech-support",
    "Craft-repair",
    "Other-service",
    "Sales",
    "Exec-managerial",
    "Prof-specialty",
    "Handlers-cleaners",
    "Machine-op-inspct",
    "Adm-clerical",
    "Farming-fishing",
    "Transport-moving",
    "Priv-house-serv",
    "Protective-serv",
    "Armed-Forces",
)
OCCUPATION = {  # education group -> weights of OCCUPATION_VALUES (normalized on use)
    "no-diploma": (1, 20, 22, 8, 3, 1, 12, 14, 5, 7, 8, 2, 2, 0.05),
    "high-school": (3, 17, 12, 11, 8, 4, 5, 8, 14, 4, 7, 0.5, 2.5, 0.05),
    "college": (5, 10, 8, 13, 14, 11, 3, 4, 15, 2, 4, 0.3, 2.5, 0.05),
    "graduate": (3, 2, 3, 9, 27, 48, 0.5, 0.5, 4, 1, 1, 0.1, 1, 0.05),
}


def _pick(rng: np.random.Generator, weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Index drawn per row from the categorical distribution ``weights[rows[i]]`` (rows of
    ``weights`` need not be normalized): one uniform per row against the cumulative weights."""
    cumulative = np.cumsum(weights, axis=1)
    cumulative /= cumulative[:, -1:]
    uniform = rng.random(len(rows))
    index = (uniform[:, None] >= cumulative[rows]).sum(axis=1)
    return np.minimum(index, weights.shape[1] - 1)


def _categorical(rng: np.random.Generator, pairs: tuple[tuple[str, float], ...], size: int) -> np.ndarray:
    values = np.array([value for value, _ in pairs], dtype=object)
    weights = np.array([[weight for _, weight in pairs]])
    return values[_pick(rng, weights, np.zeros(size, dtype=np.int64))]


def generate_table(rows: int = ROWS, seed: int | None = None) -> pa.Table:
    """``rows`` synthetic people (module docstring), columns in the demo policy's order."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise UserError(f"rows must be an integer >= 1; got {rows!r}")
    rng = np.random.default_rng(seed)
    age = np.minimum(17 + np.rint(rng.gamma(2.2, 9.5, rows)), 90).astype(np.int64)
    sex = _categorical(rng, SEX, rows)
    race = _categorical(rng, RACE, rows)
    band = np.digitize(age, [25, 45])  # 0: 17-24, 1: 25-44, 2: 45+
    marital = np.array(MARITAL_VALUES, dtype=object)[_pick(rng, np.array(list(MARITAL.values())), band)]
    education_index = _pick(
        rng,
        np.array([[frequency for _, frequency, _ in EDUCATION]]),
        np.zeros(rows, dtype=np.int64),
    )
    education = np.array([value for value, _, _ in EDUCATION], dtype=object)[education_index]
    years = np.array([years for _, _, years in EDUCATION])[education_index]
    group = np.digitize(years, [12, 13, 17])  # no diploma, high school, college, graduate
    occupation = np.array(OCCUPATION_VALUES, dtype=object)[
        _pick(rng, np.array(list(OCCUPATION.values()), dtype=np.float64), group)
    ]
    usual = rng.random(rows) < 0.45
    spread = np.clip(np.rint(rng.normal(40, 12, rows)), 1, 99).astype(np.int64)
    hours = np.where(usual, 40, spread)
    score = -9.0 + 0.35 * years + 0.04 * np.minimum(age, 60) + 0.03 * hours + 0.4 * (sex == "Male")
    rich = rng.random(rows) < 1 / (1 + np.exp(-score))
    salary = np.where(rich, ">50K", "<=50K").astype(object)
    return pa.table(
        {
            "age": pa.array(age),
            "sex": pa.array(sex, pa.string()),
            "race": pa.array(race, pa.string()),
            "marital-status": pa.array(marital, pa.string()),
            "education": pa.array(education, pa.string()),
            "occupation": pa.array(occupation, pa.string()),
            "hours-per-week": pa.array(hours),
            "salary-class": pa.array(salary, pa.string()),
        }
    )


def write_csv(path: Path | str, rows: int = ROWS, seed: int | None = None) -> Path:
    """Write :func:`generate_table` to ``path`` as comma-separated UTF-8 CSV with a header
    (atomically: temp file + rename)."""
    path = Path(path)
    table = generate_table(rows, seed)
    options = pcsv.WriteOptions(quoting_style="needed")
    write_atomic(path, lambda temp: pcsv.write_csv(table, temp, options), durable=False, mode=0o600)
    return path


def demo_policy_text() -> str:
    """The example policy ``policies/examples/demo.yaml`` with its ``dataset.path`` pointing at
    :data:`DATA_FILE` and a header saying the data is synthetic."""
    from privrelease import policies

    example = Path(policies.__file__).resolve().parent / "examples" / POLICY_FILE
    text = example.read_text(encoding="utf-8")
    text, replaced = re.subn(
        r"^(  path: )demo-census\.csv\s*$",
        rf"\g<1>{DATA_FILE}",
        text,
        count=1,
        flags=re.MULTILINE,
    )
    assert replaced == 1, f"{example}: no 'path: demo-census.csv' line to point at the data"
    header = (
        "# Copied by `privrelease demo` from policies/examples/demo.yaml; the dataset is\n"
        f"# SYNTHETIC ({DATA_FILE}, generated by privrelease.demo): no real person is in it.\n"
    )
    return header + text


def write_demo(directory: Path | str, rows: int = ROWS, seed: int | None = None) -> tuple[Path, Path]:
    """Create ``directory`` with the synthetic data, its note and the demo policy; returns
    ``(policy_path, data_path)``."""
    directory = Path(directory).expanduser().resolve()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        data = write_csv(directory / DATA_FILE, rows, seed)
        (directory / NOTE_FILE).write_text(
            "SYNTHETIC DATA - no real person is in it.\n\n"
            f"{DATA_FILE} was generated by privrelease.demo (numpy, "
            f"{'seed ' + str(seed) if seed is not None else 'seeded from the OS CSPRNG'}) with "
            f"{rows} rows and exactly the columns and values declared in {POLICY_FILE}.\n"
            "It exists to try privrelease end to end; see privrelease/demo.py for how each "
            "column is drawn.\n",
            encoding="utf-8",
        )
        policy = directory / POLICY_FILE
        policy.write_text(demo_policy_text(), encoding="utf-8")
    except PermissionError as error:
        raise UserError(
            f"cannot write the demo files to {str(directory)!r}: permission denied "
            f"({error.filename}); choose another --dir"
        ) from None
    except OSError as error:
        raise UserError(f"cannot write the demo files to {str(directory)!r}: {error.strerror or error}") from None
    return policy, data
