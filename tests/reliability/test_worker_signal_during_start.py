"""SIGTERM while a cluster worker starts, once it has connected to etcd: during its preloads, between them and its
registration, and right after it registered. Each time the worker exits 0 promptly and leaves no record in etcd
(none written, or the one written revoked). Before, a SIGTERM that came before the preloads had finished killed the
process (SIGTERM's default disposition: exit -15), as its handlers were installed only after them."""

from __future__ import annotations

import signal
import time

import pytest

from reliability.slow_worker import registered

pytestmark = pytest.mark.process

# Log lines of a worker's start, in order: etcd read (its bundle's config hash), the preloads, its registration.
CONNECTED = "config hash"
PRELOADED = "loaded test/tiny-cls"
REGISTERED = "registered workers/"
# Two tiny models to preload: the start spends a while between etcd and the registration.
PRELOADS = "test/tiny-mean,test/tiny-cls"


@pytest.mark.parametrize("after", [CONNECTED, PRELOADED, REGISTERED], ids=["preloading", "preloaded", "registered"])
def test_a_sigterm_during_start_exits_0_promptly_and_leaves_nothing_in_etcd(cluster, after: str) -> None:
    worker = cluster.start_worker("w1", wait=False, SIE_PRELOAD_MODELS=PRELOADS)
    deadline = time.monotonic() + 180
    while after not in worker.log():  # looked at often: the signal lands soon after the line
        assert time.monotonic() < deadline and worker.process.poll() is None, worker.log()[-3000:]
        time.sleep(0.01)
    worker.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code = worker.process.wait(timeout=60)
    stopped_s = time.monotonic() - signalled
    log = worker.log()
    assert code == 0, log[-3000:]
    assert stopped_s < 30, f"stopped {stopped_s:.1f} s after the signal"
    assert registered(cluster) == {}, "a record was left in etcd"
    assert "Traceback" not in log, log[-3000:]
    if after == CONNECTED:  # the second preload takes a while; after the last one, a busy machine may deliver the
        # signal only once the worker has registered and served, which is the third case's outcome
        assert "serving sie.v1.Inference" not in log, "it went on to serve"
