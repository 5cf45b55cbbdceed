"""A worker's registration outlives the etcd endpoint it first reached (issue 32, lease keeper).

SIE_ETCD_ENDPOINTS may list several members of one etcd cluster. An etcd connection stays on the endpoint it first
reached, so when that member died the worker's keep-alives and record refreshes failed for good while the others
served: its record left etcd one lease TTL later and never came back (gateways routed nothing more to a healthy
worker). The lease keeper now connects again after a failed call, to whichever endpoint answers, and every
registration write and the final revoke go through it.

A relay in front of etcd (reliability/link_cutter.py) is the first endpoint, etcd itself the second; the relay is cut
(connections dropped, new ones refused) and stays cut.
"""

from __future__ import annotations

import signal
import time

from local_cluster import wait_until
from reliability.link_cutter import LinkCutter
from reliability.slow_worker import WARM, draining, registered

LEASE_TTL_S = 3  # the cluster fixture's SIE_WORKER_LEASE_TTL_S


def test_the_registration_survives_the_first_etcd_endpoint_dying_and_still_drains_and_leaves(cluster) -> None:
    relay = LinkCutter(cluster.etcd_endpoint)
    try:
        worker = cluster.start_worker("w1", SIE_ETCD_ENDPOINTS=f"{relay.address},{cluster.etcd_endpoint}", **WARM)
        wait_until(lambda: "w1" in registered(cluster), what="w1 registered")
        assert relay.accepted > 0  # it did connect through the first endpoint
        relay.cut()
        watched_until = time.monotonic() + 3 * LEASE_TTL_S
        missing = 0
        while time.monotonic() < watched_until:
            record = registered(cluster).get("w1")
            missing += record is None
            time.sleep(0.25)
        assert missing == 0, f"w1's record was missing {missing} times in {3 * LEASE_TTL_S} s"
        # Draining and leaving go through the endpoint that answers too: the record says not ready, then is gone.
        worker.process.send_signal(signal.SIGTERM)
        record = draining(cluster, "w1")
        assert record is None or not record.ready
        assert worker.process.wait(timeout=60) == 0
        assert "w1" not in registered(cluster)
    finally:
        relay.close()
