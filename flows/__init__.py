"""The release flow and its steps: :mod:`.release` (the Prefect ``release`` flow and its
tasks), :mod:`.steps` (the plain step functions the tasks wrap, testable without Prefect, and
their orchestration), the stage modules they come from (:mod:`.opening`, :mod:`.data`,
:mod:`.outputs`, :mod:`.reporting`, :mod:`.publishing`, sharing :mod:`.context`), the
mechanism :mod:`.registry`, and the engines a run's data work can use (:mod:`.engines`: in
the flow's process, or partition by partition on a Dask cluster with :mod:`.partitions` and
:mod:`.scaled`). :mod:`.preflight` checks a run in about a second before Prefect starts;
:mod:`.recovery` settles runs a crash left behind.

Importing this package does not import Prefect; importing :mod:`.release` does.
"""
