"""`sie up --images`: the local stack with each service and Envoy run from its image answers the README's encode and
/v1/embeddings calls, and the OpenAI client, with the vectors the stack of this checkout's Python gives; Ctrl-C
(SIGTERM) leaves no container behind. And the images themselves: labelled, unprivileged, torch only in the worker's."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from container_images import build_images, engine_or_skip
from sie_stack.containers import IMAGES
from sie_up_process import SieUp

pytestmark = [pytest.mark.process, pytest.mark.slow]

ENGINE = engine_or_skip()
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# The README's calls (Quick start).
ENCODE = {"items": [{"id": "q1", "text": "how do vector databases work?"}], "is_query": True}
EMBEDDINGS = {"model": MODEL, "input": ["first", "second"]}


@pytest.fixture(scope="module")
def images() -> list[str]:
    return build_images()


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)


def answers(stack: SieUp) -> dict[str, np.ndarray]:
    """The README's encode and /v1/embeddings through Envoy, and the OpenAI client's embeddings."""
    import openai

    encoded = post(f"{stack.http}/v1/encode/{MODEL}", ENCODE)
    embedded = post(f"{stack.http}/v1/embeddings", EMBEDDINGS)
    client = openai.OpenAI(base_url=f"{stack.http}/v1", api_key="unused")
    from_openai = client.embeddings.create(model=MODEL, input=EMBEDDINGS["input"])
    return {
        "encode": np.array([item["dense"]["values"] for item in encoded["results"]], dtype=np.float32),
        "embeddings": np.array([item["embedding"] for item in embedded["data"]], dtype=np.float32),
        "openai": np.array([item.embedding for item in from_openai.data], dtype=np.float32),
    }


def containers_named(fragment: str) -> list[str]:
    listed = subprocess.run(
        [ENGINE.binary, "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True, timeout=60, check=True
    )
    return [name for name in listed.stdout.split() if fragment in name]


def test_the_stack_from_the_images_answers_as_the_stack_of_this_python(images, tmp_path: Path) -> None:
    for name in ("venv", "images"):
        (tmp_path / name).mkdir()
    venv = SieUp.start(tmp_path / "venv")
    try:
        venv.wait_up()
        expected = answers(venv)
    finally:
        venv.stop()
    stack = SieUp.start(tmp_path / "images", env={"SIE_STACK_IMAGES": "true"})
    try:
        banner = stack.wait_up(timeout_s=600)
        assert f"images              {', '.join(IMAGES.values())}" in banner
        assert f"HTTP/JSON and gRPC  {stack.http}   (Envoy)" in banner
        running = containers_named(f"-{stack.ports['gateway']}") + containers_named(f"-{stack.ports['http']}")
        assert sorted(running) == sorted([f"sie-gateway-{stack.ports['gateway']}", f"sie-envoy-{stack.ports['http']}"])
        worker = f"sie-worker-{stack.ports['worker']}"
        uid = subprocess.run(
            [ENGINE.binary, "exec", worker, "id", "-u"], capture_output=True, text=True, timeout=60, check=False
        )
        assert uid.stdout.strip() == "10001", uid.stderr
        status = subprocess.run(  # no capability and no setuid escalation (UNPRIVILEGED)
            [ENGINE.binary, "exec", worker, "cat", "/proc/1/status"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        held = dict(line.split(":\t", 1) for line in status.stdout.splitlines() if ":\t" in line)
        assert held["NoNewPrivs"].strip() == "1" and int(held["CapBnd"], 16) == 0, status.stdout
        got = answers(stack)
    finally:
        stack.stop()
    for call, vectors in expected.items():
        assert got[call].shape == vectors.shape and vectors.shape[1] == 384, call
        np.testing.assert_allclose(got[call], vectors, rtol=0, atol=1e-6, err_msg=call)
    ports = [stack.ports[name] for name in ("config", "gateway", "http")] + [stack.ports["worker"]]
    assert [name for port in ports for name in containers_named(f"-{port}")] == [], "containers left after SIGTERM"


def test_the_images_are_labelled_unprivileged_and_torch_is_only_in_the_workers(images) -> None:
    revision = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for service, image in IMAGES.items():
        config = json.loads(
            subprocess.run([ENGINE.binary, "image", "inspect", "--format", "{{json .Config}}", image],
                           capture_output=True, text=True, timeout=60, check=True).stdout
        )  # fmt: skip
        labels = config["Labels"]
        assert labels["org.opencontainers.image.version"] == image.split(":")[1], image
        assert labels["org.opencontainers.image.revision"].startswith(revision), image
        assert config["User"] == "10001", image
        torch = subprocess.run(
            [ENGINE.binary, "run", "--rm", "--network", "none", *ENGINE.run_flags(), "--entrypoint", "python", image,
             "-c", "import importlib.util; print(importlib.util.find_spec('torch') is not None)"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        assert torch.stdout.strip() == str(service == "sie_worker"), image
