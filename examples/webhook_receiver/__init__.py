"""An example receiver of the outbox's webhooks: verify each with `standardwebhooks`, handle each
`webhook-id` once (`receiver.py`; docs/how-to/receive-webhooks.md)."""
