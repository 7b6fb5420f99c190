"""The audit database: what was released, under which approved policy, from which dataset, with
which guarantees, and the privacy budget each dataset has left.

- :mod:`~privrelease.audit.models`: SQLModel tables.
- :mod:`~privrelease.audit.database`: engine and sessions from the settings, Alembic migrations.
- :mod:`~privrelease.audit.chain`: the hash-chained audit log, external chain heads, ``verify``.
- :mod:`~privrelease.audit.signing`: Ed25519 signatures of records, heads, releases and the witness.
- :mod:`~privrelease.audit.witness`: the witness file and the check every run makes before it spends.
- :mod:`~privrelease.audit.approvals`: policy versions and approvals.
- :mod:`~privrelease.audit.identities`: dataset identities (``dataset.id``) and their vintages (files).
- :mod:`~privrelease.audit.records`: datasets, runs, outputs, guarantees, reports.
- :mod:`~privrelease.audit.ledger`: lifetime budgets; reserve / commit / release.

Every write goes through these functions, which append the hash-chain record describing the
row in the same transaction. Nothing here imports Prefect.
"""
