"""Routing decisions: eligibility, model affinity, least outstanding work, one cold target."""

from __future__ import annotations

from sie_common.cluster.cluster_store import WorkerRecord
from sie_gateway.routing import choose_worker, eligible_workers


def worker(worker_id: str, *, loaded: tuple[str, ...] = (), profile: str = "l4", pool: str = "", bundle: str = "default", ready: bool = True, queue: int = 0) -> WorkerRecord:
    return WorkerRecord(worker_id, f"{worker_id}:1", bundle, profile, pool=pool, loaded_models=frozenset(loaded), ready=ready, queue_depth=queue)


WORKERS = [
    worker("a", loaded=("m/x",)),
    worker("b", loaded=("m/x", "m/y")),
    worker("c"),
    worker("d", profile="a100"),
    worker("e", pool="tenant-1"),
    worker("f", bundle="gliner"),
    worker("g", ready=False, loaded=("m/x",)),
]


def ids(workers) -> list[str]:
    return [w.worker_id for w in workers]


def test_eligibility_by_bundle_profile_pool_and_readiness() -> None:
    assert ids(eligible_workers(WORKERS, bundles={"default"}, machine_profile="l4")) == ["a", "b", "c"]
    assert ids(eligible_workers(WORKERS, bundles={"default"})) == ["a", "b", "c", "d"]
    assert ids(eligible_workers(WORKERS, bundles={"default"}, pool="tenant-1")) == ["e"]
    assert ids(eligible_workers(WORKERS, bundles={"gliner"})) == ["f"]
    assert ids(eligible_workers(WORKERS, bundles={"default"}, machine_profile="l4", exclude={"a"})) == ["b", "c"]


def test_prefers_workers_with_the_model_loaded_then_least_outstanding() -> None:
    candidates = eligible_workers(WORKERS, bundles={"default"}, machine_profile="l4")
    assert choose_worker(candidates, "m/x", {}).worker_id == "a"
    assert choose_worker(candidates, "m/x", {"a": 3, "b": 1}).worker_id == "b"
    assert choose_worker(candidates, "m/y", {"b": 50}).worker_id == "b"  # affinity beats load


def test_a_cold_model_goes_to_one_stable_worker() -> None:
    candidates = eligible_workers(WORKERS, bundles={"default"}, machine_profile="l4")
    chosen = {choose_worker(candidates, "m/cold", {"a": n}).worker_id for n in range(10)}
    assert len(chosen) == 1
    # Different cold models spread over the workers.
    spread = {choose_worker(candidates, f"m/cold-{n}", {}).worker_id for n in range(40)}
    assert spread == {"a", "b", "c"}


def test_no_candidate_is_none() -> None:
    assert choose_worker([], "m/x", {}) is None
