"""Prefect flows and their steps: :mod:`.release` (the ``release`` flow and its tasks),
:mod:`.steps` (the plain functions the tasks wrap, testable without Prefect) and :mod:`.scale`
(SDGS partition by partition on a Dask cluster).

Importing this package does not import Prefect; importing :mod:`.release` does.
"""
