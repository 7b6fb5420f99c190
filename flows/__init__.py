"""Prefect flows and their steps: :mod:`.release` (the ``release`` flow and its tasks) and
:mod:`.steps` (the plain functions the tasks wrap, testable without Prefect).

Importing this package does not import Prefect; importing :mod:`.release` does.
"""
