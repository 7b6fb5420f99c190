"""Dataset identities and their vintages.

An identity (:class:`~privrelease.audit.models.DatasetIdentity`, the policy's ``dataset.id``) is
the population a dataset is about; it holds the lifetime budget and notion, fixed at its first
registration. Every file read for it is a vintage (a :class:`~privrelease.audit.models.Dataset`
row: fingerprint, size, row count), so a file with one row appended or one cell edited is a
new vintage of the same identity and shares its budget. A fingerprint belongs to one identity.

Each function writes its row and appends the hash-chain record describing it in the caller's
session, under the audit write lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session, col, select

from privrelease import identity
from privrelease.audit import chain
from privrelease.audit.models import Dataset, DatasetIdentity, Run
from privrelease.errors import UserError

__all__ = [
    "Vintage",
    "clash",
    "find_identity",
    "list_identities",
    "register_identity",
    "register_vintage",
    "vintages_of",
]

HEX = set("0123456789abcdef")


def _check_budget(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise UserError(f"lifetime budget epsilon must be finite and >= 0; got {epsilon}")
    if not 0 <= delta < 1:
        raise UserError(f"lifetime budget delta must be in [0, 1); got {delta}")


def register_identity(
    session: Session,
    identity_id: str,
    *,
    lifetime_epsilon: float,
    lifetime_delta: float,
    notion: str,
) -> DatasetIdentity:
    """Register a dataset identity with its lifetime budget, or return the registered one.

    The budget and notion are fixed at first registration: stating another raises
    :class:`UserError` (a budget that could be raised is no budget)."""
    message = identity.problem(identity_id, "dataset.id")
    if message:
        raise UserError(message)
    _check_budget(lifetime_epsilon, lifetime_delta)
    chain.lock(session)  # before the look-up: concurrent registrations wait, then find it
    existing = session.get(DatasetIdentity, identity_id)
    if existing is not None:
        message = clash(existing, lifetime_epsilon, lifetime_delta, notion)
        if message:
            raise UserError(message)
        return existing
    registered = DatasetIdentity(
        id=identity_id,
        lifetime_epsilon=lifetime_epsilon,
        lifetime_delta=lifetime_delta,
        notion=notion,
    )
    chain.append(session, "dataset_identity_registered", registered)
    return registered


def clash(existing: DatasetIdentity, epsilon: float, delta: float, notion: str) -> str | None:
    """Why a release stating lifetime budget (``epsilon``, ``delta``) under ``notion`` cannot
    charge the registered dataset ``existing`` (its budget or accountant differs), else None."""
    changed = [
        what
        for what, same in (
            ("lifetime budget", (epsilon, delta) == (existing.lifetime_epsilon, existing.lifetime_delta)),
            ("accountant", notion == existing.notion),
        )
        if not same
    ]
    if not changed:
        return None
    return (
        f"dataset {existing.id} already has lifetime budget epsilon={existing.lifetime_epsilon:g}, "
        f"delta={existing.lifetime_delta:g} under the {existing.notion} accountant; got epsilon={epsilon:g}, "
        f"delta={delta:g} ({notion}): a dataset's {' and '.join(changed)} cannot be changed"
    )


def register_vintage(
    session: Session,
    identity_id: str,
    fingerprint: str,
    *,
    size_bytes: int,
    row_count: int,
    label: str | None = None,
) -> Dataset:
    """Register a file (by fingerprint) as a vintage of the registered identity, or return the
    registered vintage. A fingerprint already registered under another identity is refused:
    the same bytes are about the same people."""
    fingerprint = fingerprint.lower()
    if len(fingerprint) != 64 or not set(fingerprint) <= HEX:
        raise UserError(f"dataset fingerprint must be 64 hex digits (sha256); got {fingerprint!r}")
    chain.lock(session)
    if session.get(DatasetIdentity, identity_id) is None:
        raise UserError(f"dataset {identity_id!r} is not registered: register_identity first")
    existing = session.get(Dataset, fingerprint)
    if existing is not None:
        if existing.identity_id != identity_id:
            raise UserError(
                f"dataset file with sha256 {fingerprint[:12]} is already a vintage of dataset "
                f"{existing.identity_id}; the policy names dataset.id {identity_id}: the same "
                f"bytes are about the same people (use dataset.id: {existing.identity_id})"
            )
        assert (existing.size_bytes, existing.row_count) == (size_bytes, row_count), (
            f"dataset {fingerprint}: same sha256, different size or row count"
        )
        return existing
    vintage = Dataset(
        fingerprint=fingerprint,
        identity_id=identity_id,
        size_bytes=size_bytes,
        row_count=row_count,
        label=label,
    )
    chain.append(session, "dataset_registered", vintage, dataset=identity_id)
    return vintage


def find_identity(session: Session, ref: str) -> DatasetIdentity:
    """An identity by id, or the identity of a vintage named by its full fingerprint, a unique
    fingerprint prefix or its label."""
    ref = ref.strip()
    found = session.get(DatasetIdentity, ref)
    if found is not None:
        return found
    prefix = ref.lower()
    matches = list(
        session.exec(
            select(Dataset).where(col(Dataset.fingerprint).startswith(prefix) | (col(Dataset.label) == ref))
        ).all()
        if ref
        else []
    )
    owners = sorted({vintage.identity_id for vintage in matches})
    if not owners:
        raise UserError(f"no dataset with id, fingerprint or label {ref!r} in the audit database")
    if len(owners) > 1:
        raise UserError(f"dataset {ref!r} is ambiguous: it matches files of {', '.join(owners)}")
    owner = session.get(DatasetIdentity, owners[0])
    assert owner is not None, f"vintage of unknown identity {owners[0]}"
    return owner


def list_identities(session: Session) -> list[DatasetIdentity]:
    """Every registered identity, oldest first."""
    return list(session.exec(select(DatasetIdentity).order_by(col(DatasetIdentity.registered_at))).all())


@dataclass(frozen=True)
class Vintage:
    """A file read for an identity: its row, when a run first read it, which runs read it."""

    dataset: Dataset
    first_read: datetime | None
    runs: list[str]


def vintages_of(session: Session, identity_id: str) -> list[Vintage]:
    """The vintages of an identity, oldest first, with the runs that read each (data read)."""
    vintages = session.exec(
        select(Dataset).where(Dataset.identity_id == identity_id).order_by(col(Dataset.registered_at))
    ).all()
    reads = session.exec(
        select(Run)
        .where(col(Run.dataset_fingerprint).in_([v.fingerprint for v in vintages]))
        .where(col(Run.data_read_at).is_not(None))
        .order_by(col(Run.data_read_at))
    ).all()
    result = []
    for vintage in vintages:
        runs = [run for run in reads if run.dataset_fingerprint == vintage.fingerprint]
        result.append(Vintage(vintage, runs[0].data_read_at if runs else None, [run.id for run in runs]))
    return result
