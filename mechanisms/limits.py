"""Bounds on the arguments of the SDGS calculus, shared by the Python API and the policy schema
(``policies/fields.py`` imports them: one source of truth). Free of numpy, so the schema stays
light to import."""

MIN_BETA = 1e-4
"""Smallest sampling probability: the SDGS calculus scans cell sizes up to about k / beta, so its
work grows with 1 / beta."""
