"""The Python API, for notebooks and scripts: the same functions the command line calls,
returning typed results instead of printing. Importing :mod:`privrelease` stays light; each
function imports what it needs.

>>> import privrelease
>>> plan = privrelease.plan("policies/examples/demo.yaml")
>>> plan.passed, plan.notion
(True, 'probabilistic')
>>> twelve = privrelease.compose("policies/examples/demo.yaml", times=12, delta=1e-6)
>>> twelve.method, twelve.epsilon == 12 * plan.guarantee.epsilon  # the demo's notion: stated points add up
('sequential composition (Theorem 2)', True)

Releases: :func:`run`, :func:`rerun`, :func:`reissue`; approvals: :func:`approve`,
:func:`revoke`; the audit database: :func:`ledger`, :func:`list_ledgers`, :func:`report`,
:func:`list_reports`, :func:`verify`; each calls the code its command calls and prints nothing.

User mistakes raise :class:`privrelease.errors.UserError` (a bad policy, file, setting or data
value) or :class:`privrelease.errors.TargetNotMet` (a target or the budget would be exceeded),
and a lost Dask cluster :class:`privrelease.errors.ClusterFailure`, with the same messages the
command line prints; a release's refusal inside the flow names its step
(:func:`privrelease.running.expected_failure`). Anything else is a bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privrelease.approving import Approved, Revoked
    from privrelease.audit.ledger import DatasetLedger, Runway
    from privrelease.audit.verification import VerifyResult
    from privrelease.flows.context import Published
    from privrelease.mechanisms.composition import Composition
    from privrelease.mechanisms.count_intervals import CountIntervals
    from privrelease.mechanisms.reconstruction import CountEstimate
    from privrelease.planning import Plan
    from privrelease.policies.loader import LoadedPolicy
    from privrelease.reissuing import Reissued
    from privrelease.reports.stored import Located, StoredReport

PathLike = str | Path


def load(policy: PathLike) -> LoadedPolicy:
    """The validated policy (:class:`privrelease.policies.LoadedPolicy`); every problem of the
    file is reported at once in the :class:`~privrelease.errors.UserError`."""
    from privrelease.policies import load_policy

    return load_policy(policy)


def plan(policy: PathLike) -> Plan:
    """Every guarantee of the policy's release and a check per target
    (:class:`privrelease.planning.Plan`: ``.passed``, ``.guarantee``, ``.checks``, and
    ``.accuracy``: per mechanism its typed
    :class:`~privrelease.mechanisms.accuracy.AccuracyStatement`). Reads no data.

    >>> statement = plan("policies/examples/demo.yaml").accuracy["mean-hours"]
    >>> statement.noise is not None and statement.noise.half_width[0.95] > 0
    True
    """
    from privrelease.planning import plan_policy

    return plan_policy(load(policy))


def compose(
    policy: PathLike, *, times: int = 1, delta: float | None = None, epsilon: float | None = None
) -> Composition:
    """The (epsilon, delta)-DP of ``times`` runs of the policy's release under the policy's
    accounting notion (``targets.accounting``, as the ledger charges it), by the tightest sound
    method (:class:`privrelease.mechanisms.composition.Composition`): give ``delta`` for the
    smallest epsilon, or ``epsilon`` for the delta."""
    from privrelease.planning import composed_runs, dp_plan

    return composed_runs(dp_plan(load(policy)), times=times, delta=delta, epsilon=epsilon)


def runway(policy: PathLike) -> Runway:
    """How many more runs of the policy fit its dataset's lifetime budget, given the audit
    database's ledger (:class:`privrelease.audit.ledger.Runway`: ``.runs``, ``.spent``,
    ``.after_next_run``)."""
    from privrelease.audit import ledger
    from privrelease.audit.database import open_database, session
    from privrelease.planning import dp_plan

    planned = dp_plan(load(policy))
    with session(open_database(), readonly=True) as s:
        return ledger.policy_runway(s, planned)[1]


def verify(head: PathLike | None = None) -> VerifyResult:
    """Recompute the audit hash chain and every stored checksum, and replay every stored
    guarantee and ledger charge from its event tree
    (:class:`privrelease.audit.verification.VerifyResult`: ``.ok``, ``.problems``); with ``head``, also
    check the chain against a head file written beside a release."""
    from privrelease.audit import chain, verification
    from privrelease.audit.database import open_database, session

    with session(open_database(), readonly=True) as s:
        return verification.verify(s, head=None if head is None else chain.read_head(head), replay=True)


def run(
    policy: PathLike,
    *,
    data: PathLike | None = None,
    out: PathLike | None = None,
    server_reuse: bool | None = None,
    **options: Any,
) -> Published:
    """Run the audited release flow (Prefect) for the policy, quietly; returns what it
    published (:class:`privrelease.flows.context.Published`: ``release_dir``, ``outputs``,
    ``report``, ``statement``, ``chain_head``, ``run_id``, ``ledger_after``, ``warnings``). Records the
    run on the configured Prefect API, else on the work folder's kept server
    (:mod:`privrelease.server`; ``server_reuse=False``: a temporary one). ``options``:
    ``output_format``, ``production``, ``engine``, ``dask_address``, ``workers`` as for
    ``privrelease run``."""
    from privrelease.flows.preflight import preflight

    preflight(policy, data_path=data, **options)
    return _release(server_reuse, policy_path=str(policy), data=data, out=out, **options)


def rerun(
    run_id: str,
    *,
    data: PathLike | None = None,
    out: PathLike | None = None,
    server_reuse: bool | None = None,
    **options: Any,
) -> Published:
    """Repeat run ``run_id`` (id or unique prefix) as ``privrelease rerun``: its stored approved
    policy version and the same data (same sha256), fresh randomness, a new charge; returns what
    it published, as :func:`run`. ``options``: ``output_format``, ``engine``, ``dask_address``,
    ``workers``."""
    from privrelease.flows.preflight import preflight_rerun

    preflight_rerun(run_id, data_path=data, **options)
    return _release(server_reuse, rerun_of=run_id, data=data, out=out, **options)


def _release(server_reuse: bool | None, *, data: PathLike | None, out: PathLike | None, **parameters: Any) -> Published:
    """The release flow run quietly on the Prefect server :func:`privrelease.server.connect`
    gives (stopped after), as :func:`run` and :func:`rerun` describe."""
    from privrelease.running import run_flow
    from privrelease.server import connect

    server = connect(server_reuse)
    try:
        summary, _timings = run_flow(
            server=server,
            progress=None,
            data_path=None if data is None else str(data),
            out_dir=None if out is None else str(out),
            **parameters,
        )
    finally:
        if server is not None:
            server.stop()
    from privrelease.flows.context import Published

    return Published(**summary)


def reissue(run_id: str, *, out: PathLike | None = None) -> Reissued:
    """Hand back the outputs of an earlier run without recomputing them, as ``privrelease
    reissue``: each output and the report checked against its recorded sha256 (a missing or
    edited one is a :class:`~privrelease.errors.UserError`), copied into a new folder under
    ``out`` when given; recorded as a run of its own, nothing charged
    (:class:`privrelease.reissuing.Reissued`: ``.run_id``, ``.source_run_id``, ``.outputs``,
    ``.report``, ``.folder``, ``.chain_head``)."""
    from privrelease.reissuing import reissue as reissue_run

    return reissue_run(run_id, None if out is None else Path(out))


def approve(
    policy: PathLike,
    *,
    by: str,
    note: str | None = None,
    key: PathLike | None = None,
    binds: str = "data",
) -> Approved:
    """Record ``by``'s approval of the policy's exact content and of its data, as ``privrelease
    policy approve`` (:class:`privrelease.approving.Approved`: ``.policy``, ``.approval`` (the
    stored :class:`~privrelease.audit.models.Approval` row), ``.signature``, ``.binds``,
    ``.chain_head``). ``binds``: ``data`` (the bytes at ``dataset.path`` now, or the pinned
    ``dataset.sha256``) or ``path`` (whatever is at that path when a run reads it); ``key``: the
    approver's private key file, required once an approver registry is in effect."""
    from privrelease.approving import approve as approve_policy

    return approve_policy(policy, by, note=note, key=key, binds=binds)


def revoke(
    ref: str,
    *,
    by: str,
    reason: str,
    keys: list[PathLike] | tuple[PathLike, ...] = (),
    propose: PathLike | None = None,
) -> Revoked:
    """Withdraw every current approval of a policy version (``NAME@VERSION`` or a sha256
    prefix), as ``privrelease policy revoke`` (:class:`privrelease.approving.Revoked`:
    ``.policy``, ``.revoked``, ``.request``, ``.proposed``). ``keys``: approvers' private key
    files (needed once a registry is pinned); with ``propose``, the signed request is written
    there for the other approvers instead of applied."""
    from privrelease.approving import revoke as revoke_policy

    return revoke_policy(ref, by=by, reason=reason, keys=keys, propose=propose)


def ledger(dataset: str) -> DatasetLedger:
    """A dataset's lifetime-budget ledger, as ``privrelease ledger show``: ``dataset`` is its
    ``dataset.id``, or a file's fingerprint, fingerprint prefix or label
    (:class:`privrelease.audit.ledger.DatasetLedger`: ``.status`` (``.budget``, ``.spent``,
    ``.remaining``, ``.entries``: the stored ledger rows), ``.vintages``, ``.runway``)."""
    from privrelease.audit import ledger as ledgers_of
    from privrelease.audit.database import open_database, session

    with session(open_database(), readonly=True) as s:
        return ledgers_of.dataset_ledger(s, dataset)


def list_ledgers() -> list[DatasetLedger]:
    """Every registered dataset's ledger, oldest first, as ``privrelease ledger list``."""
    from privrelease.audit import ledger as ledgers_of
    from privrelease.audit.database import open_database, session

    with session(open_database(), readonly=True) as s:
        return ledgers_of.dataset_ledgers(s)


def list_reports() -> list[StoredReport]:
    """The runs with a stored disclosure report, and the reissues of them, oldest first, as
    ``privrelease report list`` (:class:`privrelease.reports.stored.StoredReport`)."""
    from privrelease.reports.stored import stored_reports

    return stored_reports()


def report(run_id: str) -> Located:
    """Where run ``run_id``'s report (id or unique prefix) can be read, as ``privrelease report
    show`` (:class:`privrelease.reports.stored.Located`: ``.path``, ``.sha256``, ``.source``,
    ``.note``): the recorded file when intact, else the audit database's copy written out under
    the work dir; a reissue's is its source run's."""
    from privrelease.reports.stored import locate_report

    return locate_report(run_id)


def estimate(
    published: PathLike,
    gamma: int,
    *,
    where: dict[str, str] | None = None,
    sensitive: dict[str, str],
    confidence: float = 0.95,
    delimiter: str = ",",
) -> CountEstimate:
    """The estimated true count of the rows of a SPLU-Gen table matching ``where`` (published
    unchanged) and ``sensitive`` (randomized) conditions, as ``privrelease estimate``
    (:class:`~privrelease.mechanisms.reconstruction.CountEstimate`: ``.estimate``, and for one
    sensitive value alone ``.interval``, exact at ``confidence``)."""
    from privrelease.mechanisms.reconstruction import CountQuery, PublishedTable

    table = PublishedTable.read(Path(published), gamma, delimiter=delimiter)
    return table.estimate(CountQuery.of(where or {}, sensitive), confidence=confidence)


def count_intervals(observed: int | Sequence[int], *, k: int, beta: float, confidence: float = 0.95) -> CountIntervals:
    """For published counts of (k, beta)-SDGS microdata (a group of rows with the same
    generalized values) or a crowd-blending histogram: the estimate c / beta of the people N
    behind each count c and an exact interval [lower, upper] holding N with probability at least
    ``confidence`` given that the cell was published, whatever N is
    (:class:`~privrelease.mechanisms.count_intervals.CountIntervals`: ``.estimate``,
    ``.lower``, ``.upper`` arrays and ``.rows()``; post-processing, no privacy cost), as
    ``privrelease guarantee accuracy sdgs --observed``.

    >>> cells = count_intervals([20, 25, 60], k=20, beta=0.1)
    >>> cells.lower.tolist(), cells.estimate.tolist(), cells.upper.tolist()
    ([20, 126, 465], [200.0, 250.0, 600.0], [278, 362, 763])
    """
    from privrelease.mechanisms import count_intervals as intervals

    values = [observed] if isinstance(observed, int) else list(observed)
    return intervals.count_intervals(values, k, beta, confidence)
