"""The docs' examples run as written: every code block of the files in DOCS runs against a real `sie up`, or is
marked as not runnable, with why, so an example that breaks fails the suite.

- A ```python block runs alone, in a Python process of its own (so it must hold its own imports and data), in a
  temporary directory that also holds the files the docs name as the reader's own (SAMPLE_FILES), `.sie/admin-token`
  (the stack's admin token, where `sie up` keeps it) and `.venv` (this checkout's, for `.venv/bin/grpcurl`).
- A ```sh / ```bash / ```shell block runs with `bash -euo pipefail` in the same directory; `curl` gets
  `--fail-with-body`, so an answer with HTTP status >= 400 fails the block, as does any command that fails.
- The endpoints `sie up` prints (localhost or 127.0.0.1 on 8080 Envoy, 50051 gateway, 50061 first worker, 50071
  config service) are rewritten to this test's stack, which runs on free ports.
- The models the docs name are served: the demo model, and under the other names offline stand-ins, the tiny
  random replicas of tools/corpus_models.py (STANDINS); the reader's environment is an activated `.venv` with
  SIE_ADMIN_TOKEN exported, as docs/control-plane.md has the reader do.
- `<!-- docs-test: not run: <why> -->` on the line before a block keeps it from running; the reason is required and
  test_blocks_not_run_say_why lists them (with -s). A block in a language that is not a program (NOT_PROGRAMS: json,
  yaml, text, proto) is a request, a config, output or a diagram, and is not run, for the reason NOT_PROGRAMS gives;
  a block in another language, or in none, is an error.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml

import corpus_models
from local_cluster import wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc
from sie_up_process import SieUp

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "clients/python/README.md", *sorted(f"docs/{doc.name}" for doc in (ROOT / "docs").glob("*.md")))
RUN = {"python": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
NOT_PROGRAMS = {
    "json": "a request or answer body",
    "yaml": "a model or bundle config file",
    "text": "output, a log line or a diagram",
    "proto": "a message definition",
}
NOT_RUN = re.compile(r"<!--\s*docs-test:\s*not run:\s*(.*?)\s*-->")
# The ports `sie up` prints, by what listens there.
DOC_PORTS = {8080: "http", 50051: "gateway", 50061: "worker", 50071: "config"}
ENDPOINT = re.compile(r"\b(?:localhost|127\.0\.0\.1):(" + "|".join(map(str, DOC_PORTS)) + r")\b")
ADMIN_TOKEN = "docs-examples-admin"
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence
    language: str
    code: str
    not_run: str | None  # why, when marked

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
    """The fenced code blocks of `doc`, with the not-run marker on the line before each."""
    found = []
    lines = (ROOT / doc).read_text().splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"^(\s*)(`{3,})(.*)$", lines[index])
        if fence is None:
            index += 1
            continue
        indent, ticks, language = fence.group(1), fence.group(2), fence.group(3).strip()
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == ticks)
        code = "\n".join(line.removeprefix(indent) for line in lines[index + 1 : end]) + "\n"
        marker = NOT_RUN.search(lines[index - 1]) if index else None
        found.append(Block(doc, index + 1, language, code, marker.group(1) if marker else None))
        index = end + 1
    return found


ALL_BLOCKS = [block for doc in DOCS for block in blocks(doc)]
RUNNABLE = [block for block in ALL_BLOCKS if block.language in RUN and block.not_run is None]


def test_every_block_names_its_language_and_every_marker_says_why() -> None:
    assert ALL_BLOCKS, "no code blocks found"
    known = {*RUN, *NOT_PROGRAMS}
    unknown = [f"{block.name} ({block.language!r})" for block in ALL_BLOCKS if block.language not in known]
    assert not unknown, f"blocks in no language, or one neither run nor listed in NOT_PROGRAMS: {unknown}"
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for marker in re.finditer(r"<!--\s*docs-test:.*?-->", text):
            assert NOT_RUN.fullmatch(marker.group(0)) and NOT_RUN.fullmatch(marker.group(0)).group(1), (
                f"{doc}: {marker.group(0)!r} is not `<!-- docs-test: not run: <why> -->`"
            )
    marked = {block.name for block in ALL_BLOCKS if block.not_run is not None}
    markers = sum(len(NOT_RUN.findall((ROOT / doc).read_text())) for doc in DOCS)
    assert len(marked) == markers, "a not-run marker that is not on the line before a block"


def test_blocks_not_run_say_why() -> None:
    """The blocks that do not run, each with its reason (printed with -s)."""
    for block in ALL_BLOCKS:
        if block.not_run is not None:
            assert len(block.not_run) > 10, block.name
            print(f"{block.name} ({block.language}): not run: {block.not_run}")
        elif block.language in NOT_PROGRAMS:
            print(f"{block.name} ({block.language}): not a program: {NOT_PROGRAMS[block.language]}")


# --- the stack ------------------------------------------------------------------------------------------------------

# Model id the docs name -> the tiny replica of tools/corpus_models.py that stands in for it (the demo model,
# sentence-transformers/all-MiniLM-L6-v2, is the real one `sie up` serves).
STANDINS = {
    "BAAI/bge-m3": "c/bge-m3",
    "BAAI/bge-reranker-v2-m3": "c/reranker",
    "my-org/reranker": "c/reranker",
    "naver/splade-v3": "c/splade",
    "openai/clip-vit-base-patch32": "c/clip",
    "urchade/gliner_multi-v2.1": "c/gliner",
    "facebook/bart-large-mnli": "c/nli",
    "knowledgator/gliclass-small-v1.0": "c/gliclass",
    "jackboyla/glirel-large-v0": "c/glirel",
    "IDEA-Research/grounding-dino-tiny": "c/grounding-dino",
    "google/owlv2-base-patch16-ensemble": "c/owlv2",
    "vidore/colqwen2-v1.0-hf": "c/colqwen2",
    "florence-community/Florence-2-base": "c/florence2",
}


def standin_configs(root: Path) -> list[dict]:
    """AddModel configs of the stand-ins, their weights built under `root` (each replica once)."""
    weights: dict[str, Path] = {}
    configs = []
    for model_id, replica in STANDINS.items():
        model = corpus_models.MODELS[replica]
        directory = root / replica.replace("/", "--")
        if replica not in weights:
            weights[replica] = model.build(directory)
        config = yaml.safe_load(f"path: {weights[replica]}\n" + model.config.replace("{dir}", str(directory)))
        configs.append({"id": model_id, **config})
    return configs


def _image(format: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (48, 32), (200, 120, 40)).save(buffer, format=format)
    return buffer.getvalue()


def warm(address: str, configs: list[dict]) -> None:
    """Each model loaded, by one request that the client retries until the model has loaded (a `curl` or `grpcurl`
    in the docs sent to a model still loading is answered 503 MODEL_LOADING, "retry shortly"). What the model then
    answers does not matter here: a request a model refuses (no labels, say) has still loaded it."""
    from sie_client import Item, SIEClient
    from sie_client.errors import RequestError

    image = Item(images=[_image("PNG")])
    with SIEClient(address, read_timeout_s=120) as client:
        for config in configs:
            tasks, item = (
                config.get("tasks", ["encode"]),
                image if "text" not in config.get("inputs", ["text"]) else "warm",
            )
            try:
                if "encode" in tasks:
                    client.encode(config["id"], item)
                elif "score" in tasks:
                    client.score(config["id"], "warm", [item])
                else:
                    client.extract(config["id"], item, labels=["warm"])
            except RequestError:
                pass


# Files the docs name as the reader's own.
SAMPLE_FILES = {
    "cat.jpg": lambda: _image("JPEG"),
    "cats.jpg": lambda: _image("JPEG"),
    "a.png": lambda: _image("PNG"),
    "page1.png": lambda: _image("PNG"),
    "page2.png": lambda: _image("PNG"),
    "invoice.png": lambda: _image("PNG"),
}


@dataclass(frozen=True)
class Stack:
    up: SieUp
    workdir: Path

    def rewrite(self, code: str) -> str:
        """`code` with the documented endpoints moved to this stack's ports."""
        return ENDPOINT.sub(lambda m: f"127.0.0.1:{self.up.ports[DOC_PORTS[int(m.group(1))]]}", code)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`sie up` (one worker) on free ports, serving the models the docs name."""
    tmp = tmp_path_factory.mktemp("docs-examples")
    configs = standin_configs(tmp / "models")
    up = SieUp.start(tmp, workers=1, env={"SIE_ADMIN_TOKEN": ADMIN_TOKEN})
    try:
        up.wait_up()
        credentials = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
        with grpc.insecure_channel(f"127.0.0.1:{up.ports['config']}") as channel:
            admin = config_pb2_grpc.ConfigServiceStub(channel)
            for config in configs:
                admin.AddModel(config_pb2.AddModelRequest(config=config), metadata=credentials, timeout=30)
        with grpc.insecure_channel(up.gateway) as channel:
            gateway = inference_pb2_grpc.InferenceStub(channel)
            wanted = {config["id"] for config in configs}
            known = lambda: {m.id for m in gateway.ListModels(inference_pb2.ListModelsRequest(), timeout=5).models}  # noqa: E731
            wait_until(lambda: wanted <= known(), timeout_s=60, what="the gateway knows the docs' models")
        warm(up.gateway, configs)
        workdir = tmp / "reader"
        (workdir / ".sie").mkdir(parents=True)
        (workdir / ".sie" / "admin-token").write_text(ADMIN_TOKEN + "\n")
        (workdir / ".venv").symlink_to(ROOT / ".venv")
        for name, content in SAMPLE_FILES.items():
            (workdir / name).write_bytes(content())
        yield Stack(up, workdir)
    finally:
        up.stop()


# curl as the docs call it, failing on an HTTP error status (the body is still printed).
CURL = 'curl() { command curl --fail-with-body "$@"; }\n'


@pytest.mark.process  # starts a `sie up` (the module's stack) and the examples
@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_the_example_runs(block: Block, stack: Stack) -> None:
    code = stack.rewrite(block.code)
    env = {
        **os.environ,
        "HAYSTACK_TELEMETRY_ENABLED": "False",
        "ANONYMIZED_TELEMETRY": "False",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SIE_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    env.pop("SIE_BASE_URL", None)
    env.pop("SIE_API_KEY", None)
    if RUN[block.language] == "python":
        command = [sys.executable, "-c", code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", CURL + code]
    ran = subprocess.run(
        command, cwd=stack.workdir, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
    )
    output = f"--- stdout\n{ran.stdout[-3000:]}\n--- stderr\n{ran.stderr[-6000:]}"
    assert ran.returncode == 0, f"{block.name} failed ({ran.returncode}):\n{code}\n{output}"
