"""Adversarial model directories and requests for the reference catalog's changes (issue 21), through one real
worker: how a load fails (permanent or retryable, and a message that fits the caller's trailers), what a GLiNER
directory can make the worker read and run, and hostile labels. Each test says what happened before its fix."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import build_tiny_gliner, build_tiny_head_model, write_config
from worker_process import Services, WorkerProcess, inference_stub

RERANKER = "tasks: [score]\nprofiles:\n  default:\n    adapter: cross_encoder\n"
EXTRACT = "tasks: [extract]\nprofiles:\n  default:\n    adapter: gliner\n"
HEALTHY = "test/healthy-reranker"
GLINER = "test/gliner-uni"
GLINER_BI = "test/gliner-bi"
# The caller's default limit on trailing metadata is 8 KiB; the message travels twice (grpc-message and the Status).
MESSAGE_LIMIT = 2048
HUB_ID = "attack/backbone"
HUB_REVISION = "0" * 40
# model id -> the answer of a stand-in Hub (HF_ENDPOINT) for its repository: (HTTP status, X-Error-Code)
HUB_ANSWERS = {
    "test/hub-no-repo": (404, "RepoNotFound"),
    "test/hub-no-revision": (404, "RevisionNotFound"),
    "test/hub-gated": (403, "GatedRepo"),
    "test/hub-failing": (501, ""),  # a server error (one the client does not retry, to keep the test short)
}


def _edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


# model id -> how a copy of the healthy reranker's directory is broken (each a config.json a real download could hold)
BROKEN_CONFIGS: dict[str, Callable[[Path], None]] = {
    "test/string-width": lambda d: _edit_json(d / "config.json", hidden_size="32"),
    "test/null-layers": lambda d: _edit_json(d / "config.json", num_hidden_layers=None),
    "test/zero-heads": lambda d: _edit_json(d / "config.json", num_attention_heads=0),
}
HUGE_CAUSE = "test/huge-cause"
OOM_IN_FALLBACK = "test/oom-in-import-fallback"
OOM_MESSAGE = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes"


def _runs_out_of_memory_in_an_import_fallback(directory: Path) -> None:
    """Shipped modeling code that falls back when an optional kernel is missing, and runs out of memory doing so."""
    _edit_json(directory / "config.json", auto_map={"AutoModelForSequenceClassification": "modeling_fallback.Model"})
    (directory / "modeling_fallback.py").write_text(
        f"try:\n    import sie_optional_kernel_not_installed  # noqa: F401\nexcept ImportError:\n    raise RuntimeError({OOM_MESSAGE!r})\n"
    )


def _shipped_code(directory: Path, marker: Path) -> None:
    """A backbone directory whose config names a Python file that, imported, leaves `marker` behind."""
    _edit_json(directory / "config.json", auto_map={"AutoModel": "backbone_code.Backbone"})
    (directory / "backbone_code.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\nfrom transformers import BertModel as Backbone\n"
    )


def _backbone_by_name(gliner_dir: Path, name: str) -> None:
    """gliner_config.json without the backbone's config: GLiNER reads it from `model_name`."""
    _edit_json(gliner_dir / "gliner_config.json", encoder_config=None, model_name=name)


class _StandInHub(BaseHTTPRequestHandler):
    """Answers every Hub API call for repository org/<name> as HUB_ANSWERS says for test/<name>."""

    def do_GET(self) -> None:
        name = self.path.split("/api/models/org/")[-1].split("/")[0]
        status, code = HUB_ANSWERS.get(f"test/{name}", (404, "RepoNotFound"))
        body = b'{"error": "stand-in Hub"}'
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hub_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandInHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("catalog-attack")
    configs = root / "configs"
    configs.mkdir()
    healthy = build_tiny_head_model(root / "healthy", "reranker")
    write_config(configs, HEALTHY, f"path: {healthy}\n{RERANKER}")
    for model_id, breaks in {**BROKEN_CONFIGS, HUGE_CAUSE: lambda d: _edit_json(d / "config.json", model_type="x" * 20000)}.items():
        directory = root / model_id.split("/")[1]
        shutil.copytree(healthy, directory)
        breaks(directory)
        write_config(configs, model_id, f"path: {directory}\n{RERANKER}")
    fallback = root / "oom-in-import-fallback"
    shutil.copytree(healthy, fallback)
    _runs_out_of_memory_in_an_import_fallback(fallback)
    write_config(configs, OOM_IN_FALLBACK, f"path: {fallback}\n{RERANKER}    load_options: {{trust_remote_code: true}}\n")
    uni = build_tiny_gliner(root / "gliner-uni", bi_encoder=False)
    bi = build_tiny_gliner(root / "gliner-bi", bi_encoder=True)
    write_config(configs, GLINER, f"path: {uni}\n{EXTRACT}")
    write_config(configs, GLINER_BI, f"path: {bi}\n{EXTRACT}")
    # A backbone with shipped code in a local directory outside the model's, and one in the Hugging Face cache.
    outside = root / "outside-backbone"
    shutil.copytree(uni.parent / "backbone", outside)
    _shipped_code(outside, root / "ran-outside")
    hub = root / "hub"
    snapshot = hub / f"models--{HUB_ID.replace('/', '--')}" / "snapshots" / HUB_REVISION
    shutil.copytree(uni.parent / "backbone", snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(HUB_REVISION)
    _shipped_code(snapshot, root / "ran-hub")
    for name, backbone in {"outside": str(outside), "hub": HUB_ID}.items():
        directory = root / f"gliner-{name}"
        shutil.copytree(uni, directory)
        _backbone_by_name(directory, backbone)
        write_config(configs, f"test/gliner-{name}-backbone", f"path: {directory}\n{EXTRACT}")
    for model_id in HUB_ANSWERS:
        write_config(configs, model_id, f"hf_id: org/{model_id.split('/')[1]}\nrevision: '{HUB_REVISION}'\n{RERANKER}")
    return {"root": root, "configs": configs, "hub": hub}


@pytest.fixture(scope="module")
def catalog_worker(services: Services, layout: dict[str, Path], hub_endpoint: str) -> WorkerProcess:
    env = {
        "SIE_MODELS_DIR": str(layout["configs"]),
        "SIE_PRELOAD_MODELS": "",
        "SIE_LOCAL_CACHE": str(layout["root"] / "cache"),
        "HF_HUB_CACHE": str(layout["hub"]),
        "HF_ENDPOINT": hub_endpoint,
    }
    return services.worker(env, name="catalog-worker")


@pytest.fixture(scope="module")
def catalog_stub(catalog_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(catalog_worker) as stub:
        yield stub


def _score(stub: inference_pb2_grpc.InferenceStub, model_id: str) -> Callable[[], inference_pb2.ScoreResponse]:
    request = inference_pb2.ScoreRequest(model=model_id, query=types_pb2.Item(text="a query"), items=[types_pb2.Item(id="a", text="a document")])
    return lambda: stub.Score(request, timeout=60)


def _extract(stub: inference_pb2_grpc.InferenceStub, model_id: str, texts: list[str], labels: list[str]) -> inference_pb2.ExtractResponse:
    request = inference_pb2.ExtractRequest(model=model_id, items=[types_pb2.Item(id=str(i), text=t) for i, t in enumerate(texts)], labels=labels)
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=60))
    return response


def _load_failure(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(call)
    return raised.value


@pytest.mark.parametrize("model_id", list(BROKEN_CONFIGS))
def test_a_config_field_a_model_cannot_be_built_from_is_a_permanent_failure(catalog_stub, model_id: str) -> None:
    # Before: a plain Exception (huggingface_hub's strict config validation) or ZeroDivisionError was retryable, so
    # the worker answered UNAVAILABLE MODEL_LOAD_BACKOFF and rebuilt the broken model every cool-down, without end.
    error = _load_failure(_score(catalog_stub, model_id))
    assert (error.code(), error_info(error).reason) == (grpc.StatusCode.FAILED_PRECONDITION, "MODEL_LOAD_FAILED")
    failure = catalog_stub.GetModel(inference_pb2.GetModelRequest(model=model_id)).model.failure
    assert (failure.permanent, failure.attempts) == (True, 1)
    response, _ = call_until_loaded(_score(catalog_stub, HEALTHY))
    assert len(response.scores) == 1


def test_a_huge_load_failure_is_cut_to_fit_the_callers_trailers(catalog_stub) -> None:
    # Before: the 20 kB cause went whole into the error (twice, in grpc-message and the Status), past the caller's
    # 8 KiB trailer limit: the caller got RESOURCE_EXHAUSTED / INTERNAL instead of FAILED_PRECONDITION.
    error = _load_failure(_score(catalog_stub, HUGE_CAUSE))
    assert (error.code(), error_info(error).reason) == (grpc.StatusCode.FAILED_PRECONDITION, "MODEL_LOAD_FAILED")
    assert len(error.details()) <= MESSAGE_LIMIT
    assert "characters)" in error.details() and "model type" in error.details()
    described = catalog_stub.GetModel(inference_pb2.GetModelRequest(model=HUGE_CAUSE)).model
    assert described.failure.permanent and len(described.failure.error) <= MESSAGE_LIMIT


@pytest.mark.parametrize("where", ["outside", "hub"])
def test_a_gliner_backbone_named_instead_of_saved_cannot_run_shipped_code(catalog_stub, layout: dict[str, Path], where: str) -> None:
    # Before: with encoder_config left out, GLiNER read the backbone config from model_name (a local directory
    # anywhere, or a Hub id in the local cache) and built it with trust_remote_code=True: its Python file ran.
    error = _load_failure(
        lambda: catalog_stub.Extract(
            inference_pb2.ExtractRequest(model=f"test/gliner-{where}-backbone", items=[types_pb2.Item(text="Ada")], labels=["person"]), timeout=60
        ),
    )
    assert (error.code(), error_info(error).reason) == (grpc.StatusCode.FAILED_PRECONDITION, "MODEL_LOAD_FAILED")
    assert "trust_remote_code" in error.details() or "outside the model directory" in error.details()
    assert not (layout["root"] / f"ran-{where}").exists()


@pytest.mark.parametrize("model_id", [GLINER, GLINER_BI])
def test_labels_past_the_backbones_position_table_are_answered(catalog_stub, model_id: str) -> None:
    # The replicas' tokenizer reads up to 512 tokens, the backbone positions 128 (a tokenizer that says more than its
    # model holds, as downloads do). Before: 128 labels (or one long label on the bi-encoder) failed the forward pass.
    text = "Ada Lovelace worked with Charles Babbage in London."
    cases = [
        [f"kind {index}" for index in range(128)],
        [" ".join("abcdefghijklmnopqrstuvwxyz"[i % 26] for i in range(127))],
        ["person", "", " ", "\u200b", "人物", "[SEP]"],
    ]
    for labels in cases:
        response = _extract(catalog_stub, model_id, [text, "", "word " * 5000], labels)
        assert len(response.results) == 3
        for result, item in zip(response.results, [text, "", "word " * 5000]):
            assert all(0 <= e.start < e.end <= len(item) and e.text == item[e.start : e.end] for e in result.entities)
    assert len(_extract(catalog_stub, model_id, [text], ["person", "city"]).results) == 1


@pytest.mark.parametrize("model_id", list(HUB_ANSWERS))
def test_the_hub_saying_a_repository_or_revision_is_not_there_is_permanent(catalog_stub, model_id: str) -> None:
    # Before: every Hub failure was retryable, so a wrong revision or repository id (or a gated one) answered
    # UNAVAILABLE MODEL_LOAD_BACKOFF and asked the Hub again every cool-down, without end. A Hub that fails otherwise stays retryable.
    error = _load_failure(_score(catalog_stub, model_id))
    failure = catalog_stub.GetModel(inference_pb2.GetModelRequest(model=model_id)).model.failure
    if model_id == "test/hub-failing":
        assert (error.code(), error_info(error).reason, failure.permanent) == (grpc.StatusCode.UNAVAILABLE, "MODEL_LOAD_BACKOFF", False)
        return
    assert (error.code(), error_info(error).reason) == (grpc.StatusCode.FAILED_PRECONDITION, "MODEL_LOAD_FAILED")
    assert f"Hugging Face Hub org/{model_id.split('/')[1]}" in error.details()
    assert (failure.permanent, failure.attempts) == (True, 1)


def _peak_rss(pid: int) -> int:
    """VmHWM of a process: the most resident memory it has had, in bytes."""
    return next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:"))


def test_long_texts_are_split_into_words_only_as_far_as_gliner_reads(catalog_worker: WorkerProcess, catalog_stub) -> None:
    # Before: GLiNER split each whole text into words before keeping its first max_len: four texts of 2 MiB of
    # one-character words held the device thread for seconds and grew the worker by about 750 MiB (after: what
    # holding the request takes, under 100 MiB).
    _extract(catalog_stub, GLINER, ["Ada Lovelace"], ["person"])
    start = "Ada Lovelace worked with Charles Babbage in London . "
    text = start + "." * (2**21 - len(start))  # every "." a word: 2 million words
    before = _peak_rss(catalog_worker.pid)
    answer = _extract(catalog_stub, GLINER, [text] * 4, ["person", "city"])
    grown = _peak_rss(catalog_worker.pid) - before
    # The same entities as the text cut to the words GLiNER reads (its max_len: 64 in the replica).
    cut = _extract(catalog_stub, GLINER, [start + "." * 64], ["person", "city"])
    expected = [(e.start, e.end, e.label, e.text) for e in cut.results[0].entities]
    assert expected and all([(e.start, e.end, e.label, e.text) for e in result.entities] == expected for result in answer.results)
    assert grown < 128 * 2**20, f"{grown / 2**20:.0f} MiB more"


def test_out_of_memory_in_an_import_fallback_stays_retryable(catalog_stub) -> None:
    # Before: the ImportError the fallback handled is the out-of-memory error's context, and any ImportError in the
    # chain made a failure permanent: a moment without memory refused the model until the worker restarted.
    error = _load_failure(_score(catalog_stub, OOM_IN_FALLBACK))
    assert (error.code(), error_info(error).reason) == (grpc.StatusCode.UNAVAILABLE, "MODEL_LOAD_BACKOFF")
    assert OOM_MESSAGE in error.details()
    failure = catalog_stub.GetModel(inference_pb2.GetModelRequest(model=OOM_IN_FALLBACK)).model.failure
    assert (failure.permanent, failure.attempts) == (False, 1)
