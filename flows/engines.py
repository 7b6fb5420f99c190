"""Where a release's data work runs: in the flow's process (``local``, the default) or on a
Dask cluster (``dask``). The release flow is the same either way (:mod:`.steps`): with Dask
only the fingerprint, the read and the mechanisms' per-partition work run on the workers
(:mod:`.partitions`, :mod:`.scaled`), mapped with Dask itself inside one Prefect task per
stage (the read as one Dask task per worker, each over a run of partitions: :func:`map_runs`),
so a partition costs no orchestration of its own, let alone a Prefect task run.

The cluster is the one at ``address`` (production: workers that see the data files and the
run's staging folder: an output in pieces, SDGS microdata, is computed and written by a worker,
the flow's process checking its sha256, :func:`.outputs.write_remote`) or, without one, a ``LocalCluster`` of ``workers`` processes, one thread each, started for the
run and closed at its end.

What a run holds in this process between its steps (never passed through Prefect: task
parameters and results carry no data) is one :class:`Held` per run, owned here: its data file
opened at the checked path, the checked table (local engine) or every mechanism's merged
partial result (Dask), and its Dask client. Steps reach it by the run id (:func:`held`);
:func:`release` closes and forgets all of it when the run ends.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from privrelease.errors import ClusterFailure, UserError

ENGINES = ("local", "dask")
DEFAULT_ROWS_PER_PARTITION = 1_000_000
CONNECT_TIMEOUT_SECONDS = 10
HEALTH_TICK = "1s"
"""How often a local cluster's servers and a site's workers time their event loop's health
(Dask's default 20 ms; only its 3 s "unresponsive" warning reads it)."""
WORKER_CONFIG = {
    "distributed": {
        "worker": {"profile": {"enabled": False}, "memory": {"monitor-interval": "500ms"}},
        "admin": {"system-monitor": {"interval": "2s"}, "tick": {"interval": HEALTH_TICK}},
    }
}
"""Dask settings of a local cluster's workers, and the ones recommended for a site's (README,
"Scale-out on Dask"): no statistical profile of the tasks (a stack sample every 10 ms, which
only Dask's dashboard shows), host metrics every 2 s instead of 500 ms, the worker's own
memory thresholds (spill, pause) checked every 500 ms instead of 100 ms (a local cluster's
nannies, in the flow's process, keep checking its limit, which kills a worker at 95 %, every
100 ms) and the event loop's health timed every :data:`HEALTH_TICK`. 20 M rows on 8
workers of 2 cores (``bench/scale.py --rows 20000000 --workers 8 --repeat 3``): the workers'
CPU of a release 1.71-1.78 -> 1.54 s with the profiler off and host metrics every 2 s; 8 idle
workers then still spent 0.100 CPU s a second, 0.019 with the last two settings."""
LOCAL_HTTP = "127.0.0.1:0"
"""Where a local cluster's scheduler serves HTTP (health, and the dashboard when bokeh is
installed): loopback only, a free port. With none given Dask still binds 8787 and warns when
another cluster holds it."""


@dataclass(frozen=True)
class Engine:
    """How a run computes: ``name`` (``local`` or ``dask``); for Dask the scheduler's
    ``address`` (None: a local cluster of ``workers`` processes with ``memory_limit`` each) and
    about how many rows a partition holds (whole Parquet row groups, or whole lines of a CSV file)."""

    name: str = "local"
    address: str | None = None
    workers: int = 2
    memory_limit: str = "auto"
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise UserError(f"engine must be one of {', '.join(ENGINES)}; got {self.name!r}", field="engine")
        if not 1 <= self.workers <= 1024:
            raise UserError(f"workers must be an integer in [1, 1024]; got {self.workers}", field="workers")
        if self.rows_per_partition < 1:
            raise UserError(f"rows_per_partition must be >= 1; got {self.rows_per_partition}")
        if self.address is not None and self.name != "dask":
            raise UserError("a Dask address needs --engine dask", field="dask_address")

    @property
    def scaled(self) -> bool:
        return self.name == "dask"

    def describe(self) -> str:
        if not self.scaled:
            return "in-process"
        where = f"the cluster at {self.address}" if self.address else f"a local cluster of {self.workers} processes"
        return f"Dask, on {where}"


def local_cluster(workers: int, memory_limit: str | int) -> Any:
    """A ``LocalCluster`` of ``workers`` processes, one thread each, with ``memory_limit`` each:
    its workers run with :data:`WORKER_CONFIG` in their own processes (a nanny merges the
    configuration it is given into its worker's only at the top level, hence this process's
    configuration with it over it), and its scheduler and nannies, which live in this process,
    time their event loops' health every second too (the nannies keep their 100 ms memory
    limit). Idle, 8 workers' nannies and scheduler then spend 0.030 CPU s a second here instead
    of 0.043. Loopback HTTP on a free port (:data:`LOCAL_HTTP`); a task's error reaches the user
    once, as the run's error, not in Dask's logs."""
    import dask.config
    from distributed import LocalCluster

    with dask.config.set({"distributed.admin.tick.interval": HEALTH_TICK}):  # read as the servers start
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=memory_limit,
            dashboard_address=LOCAL_HTTP,
            silence_logs=logging.CRITICAL,
            config=dask.config.merge(dask.config.config, WORKER_CONFIG),
        )


def check_reachable(engine: Engine) -> None:
    """A quick look (about a second at most) that something listens at the scheduler's
    address, for the pre-flight: :class:`UserError` naming the address when nothing does."""
    if engine.address is None:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(engine.address if "://" in engine.address else f"tcp://{engine.address}")
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 8786), timeout=1.5):
            pass
    except (OSError, ValueError) as error:
        raise _unreachable(engine, error) from None


def _unreachable(engine: Engine, error: BaseException) -> UserError:
    """The one line an unreachable scheduler gets: its address and the error."""
    return UserError(
        f"cannot reach the Dask scheduler at {engine.address or 'a new local cluster'}: {type(error).__name__}: {error}",
        field="dask_address",
    )


@dataclass
class Held:
    """What one run holds in this process: the data file opened at its checked real path
    (the fingerprint and the read use it, never the path again), the data's fingerprint once
    computed (recorded if the run then fails before its dataset is attached), the checked table, the
    merged partial results (mechanism name -> result), the Dask client and the LocalCluster
    started for the run (None: none started), and the report's data-free parts being computed
    in the background (:func:`.reporting.prepare_report`)."""

    opened: BinaryIO | None = None
    fingerprint: str | None = None
    table: Any = None
    partials: dict[str, Any] | None = None
    client: Any = None
    cluster: Any = None
    report: Any = None


_held: dict[str, Held] = {}


def held(run_id: str) -> Held:
    """What run ``run_id`` holds in this process (empty at first)."""
    return _held.setdefault(run_id, Held())


def holds(run_id: str) -> bool:
    """Whether run ``run_id`` holds anything in this process."""
    return run_id in _held


def release(run_id: str) -> None:
    """Close the run's data file, its Dask client and local cluster, and forget its table,
    partial results and report parts (a computation still running ends on its own)."""
    found = _held.pop(run_id, None)
    if found is None:
        return
    if found.opened is not None:
        found.opened.close()
    if found.client is not None:
        found.client.close()
    if found.cluster is not None:
        found.cluster.close()


def connect(run_id: str, engine: Engine) -> Any:
    """The run's Dask client, connected on first use. An unreachable scheduler is a
    :class:`UserError` naming its address (before anything is reserved or read)."""
    state = held(run_id)
    if state.client is not None:
        return state.client
    from distributed import Client

    logging.getLogger("distributed").setLevel(logging.ERROR)
    cluster = None
    try:
        if engine.address:
            client = Client(engine.address, timeout=f"{CONNECT_TIMEOUT_SECONDS}s", set_as_default=False)
        else:
            cluster = local_cluster(engine.workers, engine.memory_limit)
            client = Client(cluster, set_as_default=False)
    except (OSError, TimeoutError) as error:
        if cluster is not None:
            cluster.close()
        raise _unreachable(engine, error) from None
    state.client, state.cluster = client, cluster
    return client


def client(run_id: str) -> Any:
    """The run's connected client (:func:`connect` ran in an earlier step of this process)."""
    found = held(run_id).client
    assert found is not None, f"run {run_id}: no Dask client in this process (the read step connects it)"
    return found


def workers(run_id: str) -> int:
    """How many workers the run's cluster has now."""
    return len(client(run_id).scheduler_info(n_workers=-1)["workers"])


def map_runs(
    run_id: str,
    function: Callable[..., Any],
    items: Sequence[Any],
    *more: Sequence[Any],
    weights: Sequence[int],
    **constants: Any,
) -> list[Any]:
    """:func:`map_gather` of ``function`` over ``items`` (and ``more``) in as many tasks as the
    cluster has workers, at most one per item: each task calls it on a run of consecutive items
    of about equal total ``weights``, one after the other (:func:`_each`; an error ends its
    run, and the map as in :func:`map_gather`). The same results in item order for fewer,
    longer tasks: a task costs its worker's event loop about 3 ms of CPU on busy cores, and the
    scheduler and client some more; 20 partitions of 1 M rows on 8 workers of 2 cores, the
    read's CPU 0.934 -> 0.902 s (mean of seven runs). With workers of equal speed the map
    takes as long (each worker reads its share either way); a slow worker keeps its share,
    where single items would go to the others."""
    from privrelease.mechanisms.partitioned import equal_runs

    bounds = equal_runs(weights, workers(run_id))
    runs = [(a, b) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    tasks = [(function, items[a:b], *(sequence[a:b] for sequence in more)) for a, b in runs]
    named = f"{function.__name__}-runs"  # what Dask's task stream, dashboard and errors show
    return [result for results in map_gather(run_id, _each, tasks, task_name=named, **constants) for result in results]


def _each(task: tuple[Any, ...], **constants: Any) -> list[Any]:
    """``[function(item, *others, **constants) for item, *others in zip(items, *more)]`` of one
    :func:`map_runs` task ``(function, items, *more)``, on a worker."""
    function, items, *more = task
    return [function(*arguments, **constants) for arguments in zip(items, *more, strict=True)]


def map_gather(
    run_id: str,
    function: Callable[..., Any],
    items: Iterable[Any],
    *more: Iterable[Any],
    task_name: str | None = None,
    **constants: Any,
) -> list[Any]:
    """``[function(item, *others, **constants) for item, *others in zip(items, *more)]`` on the
    run's cluster, in item order, its tasks named ``task_name`` (default: the function's).
    Every call is a fresh computation (``pure=False``: randomized work is never deduplicated);
    a worker lost mid-map has its calls rerun elsewhere by Dask (``allowed-failures``), else
    the map fails. On any failure the calls still pending are cancelled and the error is
    raised here."""
    from concurrent.futures import CancelledError

    from distributed import KilledWorker
    from distributed.client import ClosedClientError
    from distributed.comm import CommClosedError

    dask_client = client(run_id)
    futures = dask_client.map(function, list(items), *map(list, more), key=task_name, pure=False, **constants)
    try:
        return dask_client.gather(futures)
    except (KilledWorker, CommClosedError, ClosedClientError, CancelledError) as error:
        dask_client.cancel(futures)
        raise ClusterFailure(
            f"the Dask cluster lost the work of {task_name or function.__name__} ({type(error).__name__}: workers died more "
            "often than Dask retries, or the scheduler went away or cancelled it); nothing was published"
        ) from None
    except BaseException:
        dask_client.cancel(futures)
        raise
