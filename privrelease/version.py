"""The package's version, in a module of its own: :mod:`privrelease` re-exports it as
``__version__`` beside its lazy Python API, and the code that records which code ran
(:func:`privrelease.flows.context.code_version`) reads it here without depending on that API."""

VERSION = "0.1.0"  # as pyproject.toml's [project] version
