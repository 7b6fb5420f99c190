"""Alembic migrations of the audit database (``env.py``, ``versions/``); run them with
:func:`privrelease.audit.database.migrate`, or for development
``alembic -c audit/migrations/alembic.ini revision --autogenerate -m "..."``."""
