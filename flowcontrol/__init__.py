"""Flow control: every rule that decides when a delivery may go, in one place.

- **Destination rate** (`queue_rates`): held by the Temporal server on the destination's submit
  and poll task queues, across every worker: the server dispatches at most the rate (counted in
  activities; a batch carries `*_batch` requests).
- **Per-process pacing** (`pacing`): each worker process spaces its own requests at the queue's
  rate with a quarter second's burst, so arrivals at the provider follow the rate too.
- **Pause and resume** (`queue_rates`): a zero rate on the server (`PATCH
  /v1/destinations/{name}`, or a 410): nothing new is dispatched; activities in flight finish.
- **Throttle** (`throttle`): a 429 or 503 with `Retry-After` pauses the submit queue on the
  server until then, for every worker; the destination's flow workflow resumes it and ramps the
  rate back after storms that keep coming. Submits dispatched just before the pause meet the
  throttle on their own.
- **Circuit breaker** (`breaker`): a process whose submits to a destination keep failing (5xx,
  timeouts, connection errors) tells the destination's flow workflow, which pauses the submit
  queue, probes the destination at intervals and resumes the queue when probes succeed; items
  wait without spending attempts. The flow can tell an operator's webhook (`events_destination`).
- **Adaptive rate** (`adaptive`): with `adaptive = true`, each worker process counts its submits'
  outcomes and the destination's flow workflow moves the submit queue's rate on the server
  between a floor and a ceiling: down on congestion or slow answers, up in small steps near
  where congestion began, so the rate follows a provider's limit it was never told.
- **Endpoint disable** (`disable`): a destination that has failed for `disable_after_s` (3 days,
  its circuit open or its submits all failing between probes) is disabled by its flow workflow:
  its submit queue stays paused until an operator re-enables it; items wait, none is lost.
- **Caps and quotas** (`caps`): submits and polls out at once, and submits per sliding window,
  for the destination and for each `concurrency_key`, counted in the read model's database by
  each submit and poll activity: exact across workers and delivery hosts.
- **Priority** (`durable_outbox_temporal.contract.priority`): an item's `priority` (1 first,
  5 last) orders what waits: Temporal's priority keys on the workflow task and on the submit
  and poll activities (each queue partition ordered on its own), and in a bulk shard its own
  order for a slot and a batch. Each worker process's pacing serves its waiting requests most
  urgent first too. A shard that is continuing as new holds new submits until those out come
  back, urgent ones included.
- **Debounce** (`durable_outbox_temporal.contract.debounce_rules`, `workflows/debounce.py`):
  items of one `debounce_key` at a destination within a window become one delivery (the last
  payload, or all of them as a JSON array); the others end `superseded`. A workflow per key
  holds the window: exact across every process.

- **The guard** (`guard`): one `FlowGuard` per worker process, built from the destinations'
  policies (`FlowGuard.for_destinations`), which every submit and poll activity goes through:
  before the request the throttle's pause, pacing and priority, caps and quotas; after it the
  attempt log, and a submit's outcome counted by the throttle, the breaker and the adaptive
  rate. A rule that does not apply to a destination lets its requests straight through; a
  process without the read model's database gets rules that count nothing there
  (`caps.NoCapsGate`, `guard.NoAttemptLog`), never a missing one.

- **Why is it waiting?** (`waiting`): a queued item's `GET` names what holds it (its own
  timers, its lane, its destination's pause, throttle or open circuit, else its turn at the
  rate).

A destination configures them in its `[destinations.<name>.flow]` table
(`durable_outbox_temporal.contract.flow_policy.FlowPolicy`), beside its rates.
"""
