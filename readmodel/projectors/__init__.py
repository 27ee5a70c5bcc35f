"""Async projectors: cross-aggregate read models (`base.py`). Each comes with the aggregate type
whose events it reads (`service.aggregate_types.AggregateType`), registered by configuration."""
