"""Migration revisions; ``HEAD_REVISION`` is the newest (checked by the tests against Alembic)."""

HEAD_REVISION = "0007_policy_drafts"
