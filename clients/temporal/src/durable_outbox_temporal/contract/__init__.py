"""The contract every side shares: names, limits, ids and the typed inputs, outputs and errors.

A leaf: nothing in this package imports any other package of this project (an import-linter
contract in `pyproject.toml` checks it), so workflows, activities, the API, the read model and
the public client can all depend on it without depending on each other.
"""
