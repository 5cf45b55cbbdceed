"""What a user would pick instead: the reference engine (sie-server 0.10.1) and Infinity, each in its own environment.

Each peer is installed on first use into bench/.envs/<name> (ignored by git)
with its own Python and torch, never touching .venv, and started as a server
on loopback over the same local model directory, offline.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sie_stack.processes import ChildProcess, free_port

from http_client import json_sender
from workloads import MODEL, Send

ENVS = Path(__file__).resolve().parent / ".envs"
# pyenv's interpreters on the development machines; SIE_BENCH_PYTHON312 points elsewhere.
PYTHON312 = os.environ.get("SIE_BENCH_PYTHON312", "/root/.pyenv/versions/3.12.1/bin/python3.12")
# The CPU torch wheel the machines keep on disk (for Python 3.11); PyPI's is a CUDA build of several GB.
CPU_TORCH_WHEEL = next(iter(sorted(Path("/opt/wheels").glob("torch-*cp311*.whl"))), None)


@dataclass(frozen=True)
class PeerSpec:
    name: str
    python: str
    requirements: tuple[str, ...]


SIE_SERVER = PeerSpec("sie-server", PYTHON312, ("sie-server==0.10.1",))
INFINITY = PeerSpec(
    "infinity",
    sys.executable,
    (*((str(CPU_TORCH_WHEEL),) if CPU_TORCH_WHEEL else ()), "infinity-emb[server,torch]==0.0.78", "transformers<5"),
)


class PeerUnavailable(RuntimeError):
    """A peer could not be installed or started here; the message says what was run and what it printed."""


def ensure_env(spec: PeerSpec, log: Path) -> Path:
    """The peer's bin/ directory, creating its virtual environment on first use (minutes, once)."""
    env = ENVS / spec.name
    marker = env / ".installed"
    wanted = "\n".join(spec.requirements)
    if marker.exists() and marker.read_text() == wanted:
        return env / "bin"
    if not Path(spec.python).exists():
        raise PeerUnavailable(f"{spec.name} needs {spec.python}, which this machine does not have (set SIE_BENCH_PYTHON312)")
    commands = [[spec.python, "-m", "venv", "--clear", str(env)], [str(env / "bin" / "pip"), "install", "-q", *spec.requirements]]
    with open(log, "ab") as out:
        for command in commands:
            print(f"bench: installing {spec.name}: {' '.join(command)}", flush=True)
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                tail = log.read_text(errors="replace")[-1500:]
                raise PeerUnavailable(f"`{' '.join(command)}` failed:\n{tail}")
    marker.write_text(wanted)
    return env / "bin"


class HttpServer(ChildProcess):
    """A peer's HTTP server; ready when GET `ready_path` answers 200."""

    def __init__(self, name: str, command: Sequence[str], env: dict[str, str], log_path: Path, port: int, ready_path: str) -> None:
        super().__init__(log_path)
        self.name = name
        self.port = port
        self._ready_path = ready_path
        self._spawn(command, {**os.environ, **env})

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self._ready_path}", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 300) -> None:
        self._wait(self.ready, timeout_s)


def _offline() -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def sie_server(weights: Path, tmp: Path, torch_threads: int) -> Iterator[Send]:
    """sie-server 0.10.1 on CPU serving MODEL from `weights` (a model YAML with weights_path), torch threads as given.

    Sent JSON (it also speaks msgpack); answers `{"items": [...]}`.
    """
    bin_dir = ensure_env(SIE_SERVER, tmp / "sie-server-install.log")
    models = tmp / "sie-server-models"
    models.mkdir(exist_ok=True)
    (models / "bench-minilm.yaml").write_text(
        f"sie_id: {MODEL}\nweights_path: {weights}\n"
        "inputs: {text: true, image: false, audio: false, video: false}\n"
        "tasks: {encode: {dense: {dim: 384}, sparse: null, multivector: null}, score: null, extract: null}\n"
        "max_sequence_length: 256\n"
        "profiles:\n  default:\n    max_batch_tokens: 16384\n    compute_precision: null\n"
        "    adapter_path: sie_server.adapters.sentence_transformer:SentenceTransformerDenseAdapter\n"
        "    adapter_options:\n      loadtime: {trust_remote_code: false}\n      runtime: {pooling: mean, normalize: true}\n"
    )
    port = free_port()
    server = HttpServer(
        "sie-server",
        [str(bin_dir / "sie-server"), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
         "--models-dir", str(models), "--models", MODEL, "--preload", MODEL, "--no-hf-fallback"],
        {**_offline(), "SIE_TORCH_NUM_THREADS": str(torch_threads), "HF_HOME": str(tmp / "sie-server-hf")},
        tmp / f"sie-server-{torch_threads}.log", port, "/readyz",
    )
    try:
        server.wait_ready()
        yield json_sender(port, f"/v1/encode/{MODEL}", lambda texts: {"items": [{"text": t} for t in texts]}, "items")
    finally:
        server.stop()


@contextlib.contextmanager
def infinity(weights: Path, tmp: Path) -> Iterator[Send]:
    """Infinity (infinity-emb 0.0.78, torch engine, CPU) on the same model directory; OpenAI-style /embeddings."""
    bin_dir = ensure_env(INFINITY, tmp / "infinity-install.log")
    port = free_port()
    server = HttpServer(
        "infinity",
        [str(bin_dir / "infinity_emb"), "v2", "--model-id", str(weights), "--served-model-name", MODEL,
         "--engine", "torch", "--device", "cpu", "--port", str(port), "--host", "127.0.0.1", "--no-model-warmup"],
        {**_offline(), "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"},
        tmp / "infinity.log", port, "/health",
    )
    try:
        server.wait_ready()
        yield json_sender(port, "/embeddings", lambda texts: {"model": MODEL, "input": list(texts)}, "data")
    finally:
        server.stop()
