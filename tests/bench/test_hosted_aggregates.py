"""The hosted-aggregates probe's placement (`bench/hosted_aggregates.py`): an aggregate's host
is a stable hash of its id over the hosts, and every host gets some of many aggregates."""

from __future__ import annotations

from bench.hosted_aggregates import host_of


def test_an_aggregates_host_is_stable_and_every_host_takes_a_share() -> None:
    ids = [f"flight-{n}" for n in range(400)]
    hosts = [host_of(i, 4) for i in ids]

    assert hosts == [host_of(i, 4) for i in ids]
    assert sorted(set(hosts)) == [f"prototype-host/flight/{n}" for n in range(4)]
    assert all(hosts.count(h) > 50 for h in set(hosts))
    assert {host_of(i, 1) for i in ids} == {"prototype-host/flight/0"}
