"""Alembic migrations of the read model, one revision per schema change (`versions/`)."""
