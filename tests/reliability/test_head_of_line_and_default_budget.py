"""Head-of-line blocking (issue 20, defect 12): a 4,096-item request must not hold a 1-item request behind all of
its batches, whether the small request is for another model or the same one. And memory without a limit
(defect 16): with no CPU budget set, loads of many models must still evict under a default budget.

The worker reports, per request with `debug`, the ids of the forward passes that carried its items (ids count
up in the order the device ran them), so the test asserts ordering, not time: the small request is answered
while the bulk one is still running, and most of the bulk's forward passes ran after the small one's."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_helpers import encode_when_loaded
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_worker.models.memory import machine_memory_bytes
from tiny_models import write_model_yaml

BULK_MODEL = "test/tiny-mean"
OTHER_MODEL = "test/tiny-cls"
BULK_ITEMS = 4096
# Items the bulk request must still have queued when the small request is sent: it is on the device, mid-way.
QUEUED_AT_LEAST = BULK_ITEMS // 2
BATCH_ITEMS = 64  # SIE_MAX_BATCH_REQUESTS's default: the bulk's short texts fill batches by count, not tokens
# Forward passes the small request may wait for: the one running, the one formed behind it, and slack for a
# bulk batch formed while the small request was still being tokenized.
WAITED_AT_MOST = 3


def queue_depth(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("sie_worker_queue_depth "):
                return float(line.split()[1])
    return 0.0


@pytest.fixture(scope="module")
def fair_worker(start_module_worker):
    return start_module_worker(SIE_PRELOAD_MODELS=f"{BULK_MODEL},{OTHER_MODEL}", SIE_INSTRUMENTATION="true")


@pytest.mark.parametrize("small_model", [OTHER_MODEL, BULK_MODEL], ids=["other model", "same model"])
def test_a_one_item_request_is_answered_amid_a_4096_item_one(fair_worker, small_model: str, reliability_report) -> None:
    bulk_request = inference_pb2.EncodeRequest(
        model=BULK_MODEL, items=[types_pb2.Item(text=f"bulk item {index} " + "word " * (5 + index % 20)) for index in range(BULK_ITEMS)], debug=True
    )
    small_request = inference_pb2.EncodeRequest(model=small_model, items=[types_pb2.Item(text="a short query")], debug=True)
    with grpc.insecure_channel(fair_worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        bulk = stub.Encode.future(bulk_request, timeout=300)
        deadline = time.monotonic() + 120
        while (queued := queue_depth(fair_worker.metrics_port)) < QUEUED_AT_LEAST:
            assert not bulk.done() and time.monotonic() < deadline, "the bulk request never queued half its items"
            time.sleep(0.005)
        small = stub.Encode(small_request, timeout=300)
        bulk_running_when_small_answered = not bulk.done()
        bulk_answer = bulk.result()

    assert len(small.results) == 1 and len(bulk_answer.results) == BULK_ITEMS
    [small_batch] = [stats.batch_id for stats in small.timing.batches]
    bulk_batches = [stats.batch_id for stats in bulk_answer.timing.batches]
    after_small = sum(batch_id > small_batch for batch_id in bulk_batches)
    # The bulk passes still to run when the small request was sent, less the few it may wait for.
    due_after = int(queued) // BATCH_ITEMS - WAITED_AT_MOST
    reliability_report.add(
        "head-of-line blocking",
        f"1-item request ({'same' if small_model == BULK_MODEL else 'other'} model) amid a {BULK_ITEMS}-item one",
        bulk_passes=len(bulk_batches),
        bulk_passes_queued_when_sent=int(queued) // BATCH_ITEMS,
        bulk_passes_after_small=after_small,
        small_answered_first=bulk_running_when_small_answered,
    )
    assert bulk_running_when_small_answered
    assert after_small >= due_after, (
        f"{after_small} of the bulk's {len(bulk_batches)} forward passes ran after the small request's;"
        f" {int(queued)} bulk items were queued when it was sent"
    )


# --- defect 16: memory without a limit -------------------------------------------------------------------------

MANY_MODELS = 32
MODEL_MIB = 3.8  # each tiny model's parameters and buffers, float32 (tests/test_memory_eviction.py)
BUDGET_MIB = 12  # at a 100 % threshold: three tiny models fit, a fourth does not
RSS_GROWTH_BOUND_MIB = 150  # the 32 models' weights alone are 122 MiB; unbounded, the worker grows past it


def vm_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_without_a_budget_setting_loads_of_many_models_stay_bounded(
    start_worker, tiny_models: dict[str, Path], tmp_path: Path, reliability_report
) -> None:
    """SIE_CPU_MEMORY_BUDGET_MB unset: the budget is SIE_CPU_MEMORY_FRACTION of the machine's memory (set here so
    that it comes to BUDGET_MIB), and loading 32 models one after another evicts the least recently used."""
    models_dir = tmp_path / "many-models"
    models_dir.mkdir()
    model_ids = [f"many/tiny-{index}" for index in range(MANY_MODELS)]
    for model_id in model_ids:
        write_model_yaml(models_dir, model_id, tiny_models["test/tiny-mean"])
    fraction = BUDGET_MIB * 2**20 / machine_memory_bytes()
    worker = start_worker(
        SIE_MODELS_DIR=str(models_dir),
        SIE_MODEL_FILTER=",".join(model_ids),
        SIE_PRELOAD_MODELS="",
        SIE_CPU_MEMORY_FRACTION=f"{fraction:.12f}",
        SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT="100",
    )
    pid = worker.process.pid
    most_loaded = 0
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        encode_when_loaded(stub, model_ids[0], ["warm up"])
        rss_before = vm_rss_mib(pid)
        for model_id in model_ids:
            vectors, _ = encode_when_loaded(stub, model_id, ["a sentence"])
            assert vectors.shape == (1, 32)
            loaded = {model.id: model.memory_bytes for model in stub.ListModels(inference_pb2.ListModelsRequest()).models if model.memory_bytes}
            most_loaded = max(most_loaded, len(loaded))
            assert sum(loaded.values()) <= BUDGET_MIB * 2**20, f"{len(loaded)} models loaded after {model_id}"
        rss_growth = vm_rss_mib(pid) - rss_before
        evicted = MANY_MODELS - len(loaded)
        # The worker still answers a known request (the last model loaded).
        assert encode_when_loaded(stub, model_ids[-1], ["a sentence"])[0].shape == (1, 32)
    reliability_report.add(
        "memory without a limit",
        f"{MANY_MODELS} tiny models loaded in turn, budget from SIE_CPU_MEMORY_FRACTION ({BUDGET_MIB} MiB)",
        most_loaded=most_loaded,
        evicted=evicted,
        rss_growth_mib=round(rss_growth, 1),
    )
    assert most_loaded <= int(BUDGET_MIB // MODEL_MIB)
    assert evicted >= MANY_MODELS - int(BUDGET_MIB // MODEL_MIB)
    assert rss_growth < RSS_GROWTH_BOUND_MIB, f"the worker's RSS grew by {rss_growth:.0f} MiB"
