"""The failures a user meets, and the exit code each maps to.

User mistakes raise :class:`UserError` (exit 2): the message names the field or column, the
value and what is allowed. A release whose guarantees miss the policy's targets raises
:class:`TargetNotMet` (exit 1); a Dask cluster that loses the work, :class:`ClusterFailure`
(exit 1); an audit database that fails the check a run makes before it spends,
:class:`AuditRefused` (exit 1). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_TARGET_NOT_MET = 1
EXIT_INVALID_INPUT = 2


class UserError(ValueError):
    """Invalid input: a bad policy, file, column, value or command-line option (exit 2).
    ``field`` and ``allowed``, when given, name the input and what it may be (``--json``
    errors carry them)."""

    exit_code = EXIT_INVALID_INPUT

    def __init__(self, message: str, *, field: str | None = None, allowed: str | None = None) -> None:
        super().__init__(message)
        self.field, self.allowed = field, allowed


class TargetNotMet(RuntimeError):
    """The composed guarantees do not meet the policy's targets or remaining budget (exit 1)."""

    exit_code = EXIT_TARGET_NOT_MET


class ClusterFailure(RuntimeError):
    """The compute cluster lost the work (workers died more often than it retries, or the
    scheduler went away): nothing is published and the run is recorded as failed (exit 1)."""

    exit_code = EXIT_TARGET_NOT_MET


class AuditRefused(UserError):
    """The audit database fails the check a run makes before it spends (tampered, truncated or
    rolled back): the run is refused, nothing is charged or published (exit 1)."""

    exit_code = EXIT_TARGET_NOT_MET
