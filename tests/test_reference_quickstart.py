"""The reference SDK's quick start runs against `sie up` with only its import lines changed.

tests/data/reference_quickstart.py holds the reference documentation's sie_sdk code blocks verbatim. The test
reads each block, changes `sie_sdk` to `sie_client` on its import lines, and points the host names of the
documentation (`localhost:8080`, `your-gateway:8080`) at this test's `sie up` Envoy port (127.0.0.1 and a free
port, since 8080 may be taken on a test machine), then checks that no other line changed and runs the block.

The models are named as in the snippets: `BAAI/bge-m3` and `NovaSearch/stella_en_400M_v5` are tiny offline
replicas (tools/tiny_models.py, dense only; the real BGE-M3's three outputs are another issue), added through the
config service as a user of `sie up` would, with a tiny LoRA adapter `legal` on `BAAI/bge-m3`.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from local_cluster import model_config, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc
from sie_client import NotFoundError, SIEClient
from worker_process import Services, free_port
from stack_process import SieUp
from test_stack_up import read_until

SNIPPETS = Path(__file__).parent / "data" / "reference_quickstart.py"
BGE_M3 = "BAAI/bge-m3"
STELLA = "NovaSearch/stella_en_400M_v5"
# Added for the capacity test only: nothing else asks for it, so it stays unloaded until that test does.
COLD = "test/cold"
ADMIN_TOKEN = "quickstart-admin"
DOC_HOSTS = ("your-gateway:8080", "localhost:8080")


class Stack:
    def __init__(self, http_port: int, gateway_port: int) -> None:
        self.http_port = http_port
        self.gateway_port = gateway_port
        self.url = f"http://127.0.0.1:{http_port}"


@pytest.fixture(scope="module")
def quickstart_stack(services: Services, tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Stack:
    """`sie up` (one worker) on free ports, with the snippets' models added through its config service."""
    tmp = tmp_path_factory.mktemp("quickstart")
    ports = {name: free_port() for name in ("etcd", "config", "worker", "gateway", "http", "admin")}
    command = [sys.executable, "-m", "sie_stack", "up", "--state-dir", str(tmp / "state"), "--workers", "1"]
    for name, flag in (
        ("etcd", "etcd"),
        ("config", "config"),
        ("worker", "worker"),
        ("gateway", "gateway"),
        ("http", "http"),
        ("admin", "envoy-admin"),
    ):
        command += [f"--{flag}-port", str(ports[name])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIE_ADMIN_TOKEN": ADMIN_TOKEN}
    up = services.keep(SieUp(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)))
    read_until(up.process, "Ctrl-C stops everything.", timeout_s=300)
    models = [
        model_config(BGE_M3, tiny_models["test/tiny-mean"], loras={"legal": str(tiny_models["lora/alpha"])}),
        model_config(STELLA, tiny_models["test/tiny-cls"]),
        model_config(COLD, tiny_models["test/tiny-mean-no-prompt"], dims=32),
    ]
    with grpc.insecure_channel(f"127.0.0.1:{ports['config']}") as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        for config in models:
            admin.AddModel(
                config_pb2.AddModelRequest(config=config), metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),), timeout=30
            )
    with grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}") as channel:
        gateway = inference_pb2_grpc.InferenceStub(channel)
        known = lambda: {m.id for m in gateway.ListModels(inference_pb2.ListModelsRequest(), timeout=5).models}  # noqa: E731
        wait_until(lambda: {BGE_M3, STELLA, COLD} <= known(), timeout_s=60, what="the gateway knows the added models")
    return Stack(ports["http"], ports["gateway"])


def blocks() -> dict[str, str]:
    """The snippet file's code blocks by name (the text after "# --- block:")."""
    found: dict[str, str] = {}
    name = None
    for line in SNIPPETS.read_text().splitlines():
        if line.startswith("# --- block:"):
            name = line.removeprefix("# --- block:").split("(")[0].strip()
            found[name] = ""
        elif name is not None:
            found[name] += line + "\n"
    return found


def adapted(code: str, address: str) -> str:
    """`code` with only its import lines moved to sie_client and the documentation's hosts moved to `address`."""
    changed = []
    for line in code.splitlines():
        if re.match(r"\s*(from|import)\s+sie_sdk\b", line):
            line = line.replace("sie_sdk", "sie_client")
        for host in DOC_HOSTS:
            line = line.replace(host, address)
        changed.append(line)
    return "\n".join(changed) + "\n"


def run_block(code: str, namespace: dict[str, Any], name: str) -> Any:
    """Run `code` in `namespace` as a REPL would: the value of a last expression statement is returned."""
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, f"reference_quickstart[{name}]", "exec"), namespace)
    return None if last is None else eval(compile(ast.Expression(last.value), f"reference_quickstart[{name}]", "eval"), namespace)


def test_only_import_lines_and_hosts_change() -> None:
    code = blocks()
    assert list(code) == ["003 routing", "003 batching", "003 lora", "004 timing"]
    for text in code.values():
        for before, after in zip(text.splitlines(), adapted(text, "127.0.0.1:1").splitlines(), strict=True):
            if before != after:
                assert before.startswith("from sie_sdk") or any(host in before for host in DOC_HOSTS), before
    assert "from sie_client import SIEClient" in adapted(code["004 timing"], "127.0.0.1:1")


def test_reference_quickstart_runs_against_sie_up(quickstart_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    code = {name: adapted(text, f"127.0.0.1:{quickstart_stack.http_port}") for name, text in blocks().items()}
    chunks = [f"chunk number {n} of a long document" for n in range(5)]
    namespace: dict[str, Any] = {"chunks": chunks}
    try:
        routed = run_block(code["003 routing"], namespace, "003 routing")
        assert namespace["client"].base_url == quickstart_stack.url
        assert routed["dense"].shape == (32,)

        batched = run_block(code["003 batching"], namespace, "003 batching")
        assert [result["dense"].shape for result in batched] == [(32,)] * len(chunks)

        adapted_vector = run_block(code["003 lora"], namespace, "003 lora")["dense"]
        with SIEClient(f"127.0.0.1:{quickstart_stack.gateway_port}") as direct:  # the gateway itself, without Envoy
            np.testing.assert_allclose(direct.encode(BGE_M3, "routed by the gateway")["dense"], routed["dense"], atol=1e-6)
            np.testing.assert_allclose(direct.encode(STELLA, chunks[0])["dense"], batched[0]["dense"], atol=1e-6)
            plain = direct.encode(BGE_M3, "indemnification")["dense"]
        assert not np.allclose(adapted_vector, plain, atol=1e-4)  # options={"lora": "legal"} applied the adapter
        namespace["client"].close()

        capsys.readouterr()
        run_block(code["004 timing"], namespace, "004 timing")
        printed = ast.literal_eval(capsys.readouterr().out.strip())
        assert {"queue_ms", "inference_ms", "total_ms"} <= set(printed)
        assert all(isinstance(value, float) and value >= 0 for key, value in printed.items() if key.endswith("_ms"))
        assert namespace["result"]["dense"].shape == (32,)
    finally:
        if "client" in namespace:
            namespace["client"].close()


def test_capacity_is_what_is_loaded(quickstart_stack: Stack) -> None:
    with SIEClient(base_url=quickstart_stack.url) as client:
        capacity = client.get_capacity()
        assert capacity["models"][COLD]["loaded"] is False and capacity["status"] == "healthy"
        with pytest.raises(NotFoundError) as missing:
            client.wait_for_capacity("default", model="no/such-model", timeout_s=5)
        assert missing.value.reason == "MODEL_NOT_FOUND"
        capacity = client.wait_for_capacity("default", model=COLD, timeout_s=60, poll_interval_s=0.2)  # loads it
        assert capacity["models"][COLD]["loaded"] is True and capacity["models"][COLD]["loaded_on"] == ["worker-0"]
        assert [worker["name"] for worker in capacity["workers"]] == ["worker-0"] and capacity["worker_count"] == 1
        assert capacity["pools"] == []
        listed = {model["name"]: model for model in client.list_models()}
        assert listed[COLD]["loaded"] is True and listed[COLD]["outputs"] == ["dense"]
        assert listed[COLD]["state"] == "loaded"
        assert listed[COLD]["dims"] == {"dense": 32}  # from the model's config: the gateway knows no more than that
        assert listed[STELLA]["dims"] == {}  # its config names no dims
