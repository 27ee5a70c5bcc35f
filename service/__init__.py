"""Use cases over the Temporal client and the read model, shared by the API and later features.

Route handlers parse, authorise, call one function here and answer; what combines the workflow's
live state with the read model, fans a batch out, or sweeps an outbox lives here.
"""
