"""After the data: the exact interval for the people N behind a published SDGS / histogram count
(mechanisms/count_intervals.py). Exact conditional coverage over a grid, simulated releases
(through the histogram mechanism itself), brute-force and 40-digit mpmath bounds, the broken
variants (unconditional, normal approximation) undercovering, the CLI and the Python API."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import mpmath
import numpy as np
import pyarrow as pa
import pytest
from conftest import cpu_seconds
from scipy import special
from scipy.stats import binom

from privrelease.errors import UserError
from privrelease.mechanisms import binomial
from privrelease.mechanisms.count_intervals import count_intervals

REPO = Path(__file__).resolve().parents[1]
GRID_N = 300


def conditional_pmf(k: int, beta: float, ns: np.ndarray, cs: np.ndarray) -> np.ndarray:
    """P[X = c | X >= k; N] (rows N, columns c) by scipy.stats, 0 where N < k or c > N."""
    n, c = ns[:, None], cs[None, :]
    published = binom.sf(k - 1, n, beta)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((c >= k) & (published > 0), binom.pmf(c, n, beta) / published, 0.0)


def coverage(k: int, beta: float, lower: np.ndarray, upper: np.ndarray, cs: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Exact conditional coverage sum_c P[X = c | X >= k; N] 1{lower(c) <= N <= upper(c)} per N
    (every c <= N is in ``cs``)."""
    inside = (lower[None, :] <= ns[:, None]) & (ns[:, None] <= upper[None, :])
    return (conditional_pmf(k, beta, ns, cs) * inside).sum(axis=1)


GRID = [(k, beta, c) for k in (2, 5, 11) for beta in (0.05, 0.3, 0.9) for c in (0.9, 0.95)]


@pytest.mark.parametrize(("k", "beta", "confidence"), GRID)
def test_exact_conditional_coverage_is_at_least_the_confidence_for_every_n(k, beta, confidence) -> None:
    cs = np.arange(k, GRID_N + 1)
    ns = np.arange(k, GRID_N + 1)  # N < k is never published
    found = count_intervals(cs, k, beta, confidence)
    covered = coverage(k, beta, found.lower, found.upper, cs, ns)
    assert covered.min() >= confidence - 1e-12, (ns[covered.argmin()], covered.min())
    assert (found.lower >= cs).all() and (found.lower <= found.upper).all()
    assert (found.lower <= found.estimate).all()  # C >= 1/2: Greenberg-Mohri (module docstring)


def grid_minimum() -> float:
    """The smallest coverage minus confidence over the grid (for the record)."""
    worst = np.inf
    for k, beta, confidence in GRID:
        cs = ns = np.arange(k, GRID_N + 1)
        found = count_intervals(cs, k, beta, confidence)
        worst = min(worst, coverage(k, beta, found.lower, found.upper, cs, ns).min() - confidence)
    return float(worst)


def unconditional(cs: np.ndarray, beta: float, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The broken variant: the Clopper-Pearson-style interval of Binomial(N, beta) ignoring
    that only counts >= k are published (brute force over N)."""
    half = (1 - confidence) / 2
    ns = np.arange(0, int(cs.max() / beta * 3 + 100))
    up = binom.sf(cs[None, :] - 1, ns[:, None], beta) > half
    down = binom.cdf(cs[None, :], ns[:, None], beta) > half
    return ns[up.argmax(axis=0)], ns[len(ns) - 1 - down[::-1].argmax(axis=0)]


def normal(cs: np.ndarray, beta: float, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The broken variant: c / beta -+ z sqrt(c (1 - beta)) / beta."""
    z = special.ndtri(1 - (1 - confidence) / 2)
    half = z * np.sqrt(cs * (1 - beta)) / beta
    return np.ceil(cs / beta - half), np.floor(cs / beta + half)


@pytest.mark.parametrize("variant", [unconditional, normal])
def test_the_coverage_test_catches_broken_variants(variant) -> None:
    """The unconditional interval and the normal approximation undercover somewhere on the
    grid (small cells, where suppression keeps only lucky samples): the coverage check above
    would fail for them."""
    worst = []
    for k, beta, confidence in GRID:
        cs = ns = np.arange(k, GRID_N + 1)
        lower, upper = variant(cs, beta, confidence)
        worst.append(coverage(k, beta, lower, upper, cs, ns).min() - confidence)
    assert min(worst) < -0.05, min(worst)


def brute_force(c: int, k: int, beta: float, confidence: float) -> tuple[int, int]:
    """lower, upper by scanning every N with scipy.stats (the definition, no search)."""
    half = (1 - confidence) / 2
    ns = np.arange(c, int(c / beta * 2 + 400))
    published = binom.sf(k - 1, ns, beta)
    above = binom.sf(c - 1, ns, beta) / published
    below = (binom.cdf(c, ns, beta) - binom.cdf(k - 1, ns, beta)) / published
    return int(ns[above > half].min()), int(ns[below > half].max())


@pytest.mark.parametrize(
    ("k", "beta", "confidence"), [(2, 0.05, 0.95), (5, 0.3, 0.9), (11, 0.9, 0.95), (20, 0.1, 0.99), (50, 0.5, 0.8)]
)
def test_bounds_against_brute_force(k, beta, confidence) -> None:
    cs = np.concatenate([np.arange(k, k + 40), [k + 97, 5 * k + 3, 400]])
    found = count_intervals(cs, k, beta, confidence)
    expected = [brute_force(int(c), k, beta, confidence) for c in cs]
    assert list(zip(found.lower.tolist(), found.upper.tolist(), strict=True)) == expected


def mp_tails(c: int, k: int, beta: float, n: int) -> tuple[mpmath.mpf, mpmath.mpf]:
    """P[X >= c | X >= k; N], P[X <= c | X >= k; N] in 60 digits."""
    with mpmath.workdps(60):
        p = mpmath.mpf(beta)

        def tail(j: int) -> mpmath.mpf:
            return mpmath.betainc(j, n - j + 1, 0, p, regularized=True) if j <= n else mpmath.mpf(0)

        published = tail(k)
        return tail(c) / published, (published - tail(c + 1)) / published


@pytest.mark.parametrize(
    ("k", "beta", "cs"),
    [(300, 0.05, [300, 301, 310, 400]), (1000, 0.3, [1000, 1001, 1200]), (100, 0.001, [100, 101, 150])],
)
def test_bounds_where_the_tails_underflow_against_mpmath(k, beta, cs) -> None:
    """Publication probabilities far below 1e-300 at the small N searched: each bound passes its
    test and its neighbour fails it, in 60-digit arithmetic (monotonicity does the rest)."""
    found = count_intervals(cs, k, beta, 0.95)
    half = mpmath.mpf(0.025)
    for c, lower, upper in zip(cs, found.lower.tolist(), found.upper.tolist(), strict=True):
        assert mp_tails(c, k, beta, lower)[0] > half
        assert lower == c or mp_tails(c, k, beta, lower - 1)[0] <= half
        assert mp_tails(c, k, beta, upper)[1] > half
        assert mp_tails(c, k, beta, upper + 1)[1] <= half


@pytest.mark.parametrize(("j", "n", "p"), [(300, 400, 0.1), (1000, 1000, 0.05), (2000, 2100, 0.5), (20, 25, 0.1)])
def test_log_upper_tail_against_mpmath(j, n, p) -> None:
    with mpmath.workdps(50):
        expected = float(mpmath.log(mpmath.betainc(j, n - j + 1, 0, mpmath.mpf(p), regularized=True)))
    assert float(binomial.log_upper_tail(j, n, p)) == pytest.approx(expected, rel=1e-12)


def test_conditional_tails_are_monotone_in_n() -> None:
    """The premise of the inversion (module docstring's MLR argument), checked numerically."""
    k, beta = 5, 0.3
    ns = np.arange(k, 200)
    pmf = conditional_pmf(k, beta, ns, np.arange(k, 200))
    upper_tails = pmf[:, ::-1].cumsum(axis=1)[:, ::-1]  # P[X >= c | X >= k; N]
    assert (np.diff(upper_tails, axis=0) >= -1e-12).all()


def test_simulated_releases_through_the_histogram_agree_with_the_exact_coverage() -> None:
    """Cells of N people released by the crowd-blending histogram itself (CSPRNG sampling):
    the share of published cells whose interval holds N is within 1 point of the exact
    coverage. 100 releases of 1,000 cells each, about 50,000 published cells: by Hoeffding
    the share strays by 0.01 with probability at most 2 exp(-2 * 30,000 * 1e-4) < 0.005 even at
    30,000 cells, and far less at the ~50,000 expected (under 1e-8)."""
    from privrelease.mechanisms.histogram import crowd_blending_histogram
    from privrelease.mechanisms.schemes import Keep

    k, beta, n, confidence, cells = 5, 0.3, 16, 0.95, 1000
    table = pa.table({"cell": np.repeat(np.arange(cells), n).astype(str)})
    published = []
    for _ in range(100):
        out = crowd_blending_histogram(table, {"cell": Keep()}, k=k, beta=beta, epsilon=1.0, confidence=confidence)
        lower, upper = out.table.column("lower").to_numpy(), out.table.column("upper").to_numpy()
        published.append((lower <= n) & (n <= upper))
    hits = np.concatenate(published)
    assert len(hits) > 30_000
    cs = np.arange(k, n + 1)
    found = count_intervals(cs, k, beta, confidence)
    exact = coverage(k, beta, found.lower, found.upper, cs, np.array([n]))[0]
    assert exact >= confidence
    assert abs(hits.mean() - exact) <= 0.01, (hits.mean(), exact, len(hits))


def test_simulated_counts_many_cases() -> None:
    """200,000 conditional draws per case (numpy; published = X >= k): within 1 point of the
    exact coverage (Hoeffding: failure probability 2 exp(-2 * 200,000 * 1e-4) < 1e-17)."""
    rng = np.random.default_rng()
    for k, beta, n, confidence in [(2, 0.05, 60, 0.9), (11, 0.3, 40, 0.95), (5, 0.9, 6, 0.95), (11, 0.05, 300, 0.95)]:
        draws = rng.binomial(n, beta, size=4_000_000)
        draws = draws[draws >= k][:200_000]
        assert len(draws) == 200_000
        found = count_intervals(draws, k, beta, confidence)
        share = ((found.lower <= n) & (n <= found.upper)).mean()
        cs = np.arange(k, n + 1)
        exact_found = count_intervals(cs, k, beta, confidence)
        exact = coverage(k, beta, exact_found.lower, exact_found.upper, cs, np.array([n]))[0]
        assert abs(share - exact) <= 0.01, (k, beta, n, share, exact)


def test_vectorized_and_fast_for_many_cells() -> None:
    """10^5 cells, all counts distinct (the worst case: every count searched), in CPU time at
    most 60 times one vectorized binomial tail over the same cells (measured here; the search
    evaluates about 20 tails); repeated counts are computed once."""
    counts = np.arange(20, 100_020)
    baseline_tail, baseline = cpu_seconds(lambda: binomial.upper_tail(counts.astype(float), counts / 0.1, 0.1))
    found, seconds = cpu_seconds(lambda: count_intervals(counts[::-1], 20, 0.1))
    assert np.isfinite(baseline_tail).all()
    assert seconds <= 60 * max(baseline, 0.01), (seconds, baseline)
    assert (np.diff(found.lower[::-1]) >= 0).all() and (np.diff(found.upper[::-1]) >= 0).all()
    assert found.observed.tolist() == counts[::-1].tolist()  # the input order, not sorted


def test_beta_one_is_the_count_itself_and_errors_are_named() -> None:
    exact = count_intervals([3, 7], 3, 1.0)
    assert exact.lower.tolist() == exact.upper.tolist() == [3, 7]
    for bad, words in [([2], "got 2"), ([-1], "got -1"), ([3.5], "got 3.5"), ([True], "integers")]:
        with pytest.raises(UserError, match=words):
            count_intervals(bad, 3, 0.5)
    for confidence in (0, 1, 1.5, True):
        with pytest.raises(UserError, match="confidence must be a number in"):
            count_intervals([5], 3, 0.5, confidence)


def test_python_api() -> None:
    import privrelease

    found = privrelease.count_intervals([25, 20], k=20, beta=0.1, confidence=0.9)
    assert found.rows()[1] == {"observed": 20, "estimate": 200.0, "lower": 20, "upper": 255, "confidence": 0.9}
    assert found.rows()[1]["upper"] == brute_force(20, 20, 0.1, 0.9)[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_cli_observed_json_and_table() -> None:
    base = ("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1")
    result = cli(*base, "--observed", "20,60", "--confidence", "0.9", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["k"] == 20 and document["beta"] == 0.1 and document["confidence"] == 0.9
    assert document["rows"] == count_intervals([20, 60], 20, 0.1, 0.9).rows()
    assert set(document["rows"][0]) == {"observed", "estimate", "lower", "upper", "confidence"}
    table = cli(*base, "--observed", "60")
    assert table.returncode == 0 and "600" in table.stdout and "given that the cell was published" in table.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--observed", "19"), "--observed must be published counts, integers >= k = 20"),
        (("--observed", "-3"), "got -3"),
        (("--observed", "25.5"), "--observed must be a comma-separated list of int values; got '25.5'"),
        (("--observed", "25", "--confidence", "1.5"), "--confidence must be a number in [0.5, 1); got 1.5"),
        (("--observed", "25", "--confidence", "0"), "--confidence must be a number in [0.5, 1); got 0"),
        (("--observed", "25", "--confidence", "0.3"), "--confidence must be a number in [0.5, 1); got 0.3"),
        (("--observed", "25", "--count", "100"), "exactly one of --count"),
        ((), "exactly one of --count"),
    ],
)
def test_cli_observed_refuses_bad_values_in_one_line(args, words) -> None:
    result = cli("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_the_confidence_is_the_policys_accuracy_confidence(tmp_path: Path) -> None:
    """A histogram's intervals take the highest confidence of the accuracy targets naming it
    (release.json says so); a mechanism no target names states 0.95."""
    from privrelease.mechanisms.histogram import crowd_blending_histogram
    from privrelease.mechanisms.schemes import Keep
    from privrelease.planning import plan_policy
    from privrelease.policies import load_policy_text

    text = (REPO / "policies" / "examples" / "demo.yaml").read_text(encoding="utf-8")
    text = re.sub(r"\n  accuracy:\n(    - .*\n)+", "\n", text)  # the demo's own targets, replaced below
    assert "\ntargets:\n" in text
    text = text.replace(
        "\ntargets:\n",
        "\ntargets:\n  accuracy:\n"
        "    - {mechanism: hours-by-sex, count: 1000, relative_error: 0.5, confidence: 0.9}\n"
        "    - {mechanism: hours-by-sex, count: 5000, relative_error: 0.5, confidence: 0.99}\n",
    )
    loaded = load_policy_text(text, REPO / "policies" / "examples")
    assert loaded.policy.mechanism("hours-by-sex").interval_confidence(loaded) == 0.99
    accuracy = plan_policy(loaded).accuracy
    assert accuracy["hours-by-sex"].as_dict()["published_counts"]["confidence"] == 0.99
    assert accuracy["microdata"].as_dict()["published_counts"]["confidence"] == 0.95
    table = pa.table({"v": ["a"] * 40 + ["b"] * 7})
    out = crowd_blending_histogram(table, {"v": Keep()}, k=5, confidence=0.99).table.to_pydict()
    assert out["lower"] == out["upper"] == out["count"]  # beta = 1: the count is the cell
    sampled = crowd_blending_histogram(table, {"v": Keep()}, k=2, beta=0.5, epsilon=1.0, confidence=0.99)
    got = sampled.table.to_pydict()
    assert got["upper"] == count_intervals(got["count"], 2, 0.5, 0.99).upper.tolist()


def test_a_histogram_column_named_like_an_output_column_is_refused_by_the_policy(tmp_path: Path) -> None:
    from privrelease.policies import load_policy_text

    text = """
name: t
version: "1"
dataset:
  path: x.csv
  rows: 100
  columns:
    lower: {type: string, values: [a, b]}
generalization:
  lower: keep
mechanisms:
  - {name: h, type: histogram, columns: [lower], k: 5}
"""
    with pytest.raises(
        UserError, match="mechanisms\\[0\\].columns\\[0\\]: a histogram cannot generalize a column named 'lower'"
    ):
        load_policy_text(text, tmp_path)
