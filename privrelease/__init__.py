"""privrelease: publish data about people with provable disclosure guarantees.

The import namespace is ``privrelease``; its parts live in top-level folders
(``policies/`` is ``privrelease.policies``, ``mechanisms/`` is ``privrelease.mechanisms``, ...),
mapped in ``pyproject.toml``.
"""

__version__ = "0.1.0"
