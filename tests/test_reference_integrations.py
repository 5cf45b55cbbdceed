"""The reference's own framework integrations (sie-langchain, sie-llamaindex and sie-chroma 0.10.1 from PyPI,
installed --no-deps) run their own integration test suites against `sie up`, in two ways, both on the same stack:
- unmodified, over the reference SDK itself (sie-sdk 0.10.1 from PyPI, no alias) and its msgpack wire, in the
  reference SDK's own Python 3.12 venv (tests/reference_sdk.py) with the suites' requirements beside it;
- with only the import aliased, in this project's Python: `sie_sdk` (and its submodules) is `sie_client`.

Their suites name BAAI/bge-m3, jinaai/jina-reranker-v2-base-multilingual and urchade/gliner_multi-v2.1; the stack
serves offline stand-ins under those names (tests/reference_integration_models.py). The sdists (which carry the
tests) and the two vector-store adapters the suites import (langchain-chroma, llama-index-vector-stores-chroma)
are fetched from PyPI into .pytest_cache/ on the first run; without PyPI (or Python 3.12, for the first way) the test
skips, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from local_cluster import wait_until
from reference_integration_models import standin_configs
from reference_sdk import VECTOR_STORES, suite_python
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc
from stack_process import stop_stack
from test_stack_up import read_until
from worker_process import free_port

# Starts processes (a `sie up` and the reference suites) in fixtures of its own.
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".pytest_cache" / "reference-integrations"  # ignored by git, as reference_sdk.VENV
SUITES = {"sie-langchain": "sie_langchain", "sie-llamaindex": "sie_llamaindex", "sie-chroma": "sie_chroma"}
VERSION = "0.10.1"
ADMIN_TOKEN = "integrations-admin"
# The plain module alias: `import sie_sdk` (and `sie_sdk.types`, ...) gives sie_client's modules themselves.
ALIAS = '''"""sie_sdk is sie_client: the reference's integrations run on it with nothing else changed."""
import importlib
import sys

import sie_client

for _name in ("types", "encoding", "scoring", "client", "errors"):
    sys.modules[f"sie_sdk.{_name}"] = importlib.import_module(f"sie_client.{_name}")
sys.modules["sie_sdk"] = sie_client
'''
# Tests that fail with the reference SDK too, each with why (none known: every test is expected to pass).
FAIL_ON_THE_REFERENCE: dict[str, str] = {}


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def suites() -> dict[str, Path]:
    """Each suite's unpacked sdist, fetched once into .pytest_cache/; and the alias and vector stores on one path."""
    ready = CACHE / ".ready"
    if not ready.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        fetched = _pip(
            "download", "--no-deps", "--no-binary", ":all:", "-d", str(CACHE),
            *(f"{name}=={VERSION}" for name in SUITES),
        )  # fmt: skip
        if fetched.returncode != 0:
            pytest.skip(f"could not fetch the reference integrations from PyPI: {fetched.stderr[-400:]}")
        installed = _pip("install", "--no-deps", "--target", str(CACHE / "site"), *VECTOR_STORES)
        if installed.returncode != 0:
            pytest.skip(f"could not fetch {', '.join(VECTOR_STORES)} from PyPI: {installed.stderr[-400:]}")
        for package in SUITES.values():
            with tarfile.open(CACHE / f"{package}-{VERSION}.tar.gz") as sdist:
                sdist.extractall(CACHE, filter="data")
        (CACHE / "alias").mkdir(exist_ok=True)
        (CACHE / "alias" / "sie_sdk.py").write_text(ALIAS)
        ready.touch()
    return {name: CACHE / f"{package}-{VERSION}" for name, package in SUITES.items()}


@pytest.fixture(scope="module")
def stack_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`sie up` (one worker) on free ports, serving the stand-ins, added through its config service."""
    tmp = tmp_path_factory.mktemp("reference-integrations")
    configs = standin_configs(tmp / "models")
    ports = {name: free_port() for name in ("etcd", "config", "worker", "gateway", "http", "envoy-admin")}
    command = [sys.executable, "-m", "sie_stack", "up", "--state-dir", str(tmp / "state"), "--workers", "1"]
    for name, port in ports.items():
        command += [f"--{name}-port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIE_ADMIN_TOKEN": ADMIN_TOKEN}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        read_until(process, "Ctrl-C stops everything.", timeout_s=300)
        credentials = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
        with grpc.insecure_channel(f"127.0.0.1:{ports['config']}") as channel:
            admin = config_pb2_grpc.ConfigServiceStub(channel)
            for config in configs:
                admin.AddModel(config_pb2.AddModelRequest(config=config), metadata=credentials, timeout=30)
        with grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}") as channel:
            gateway = inference_pb2_grpc.InferenceStub(channel)
            wanted = {config["id"] for config in configs}
            known = lambda: {m.id for m in gateway.ListModels(inference_pb2.ListModelsRequest(), timeout=5).models}  # noqa: E731
            wait_until(lambda: wanted <= known(), timeout_s=60, what="the gateway knows the stand-ins")
        yield f"http://127.0.0.1:{ports['http']}"
    finally:
        stop_stack(process)


def suite_runtime(sdk: str) -> tuple[str, tuple[Path, ...]]:
    """The Python that runs the suites with `sdk` as their sie_sdk, and what goes on its path before each suite."""
    if sdk == "sie_client":
        return sys.executable, (CACHE / "alias", CACHE / "site")
    python, why_not = suite_python()
    if python is None:
        pytest.skip(why_not)
    return python, ()


def run_suite(suite: Path, url: str, report: Path, python: str, path: tuple[Path, ...]) -> dict[str, str]:
    """The suite's integration tests, run by pytest in a process of their own: each test's outcome by its id."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (*path, suite / "src")), "SIE_SERVER_URL": url}
    ran = subprocess.run(
        [python, "-m", "pytest", "tests/test_integration.py", "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", "-o", "asyncio_mode=auto", "--rootdir", str(suite), f"--junitxml={report}"],
        cwd=suite, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert report.exists(), f"{suite.name}'s pytest wrote no report: {(ran.stdout + ran.stderr)[-2000:]}"
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        name = f"{suite.name}::{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcomes[name] = (
            f"failed: {failed.get('message', '')[:300]}"
            if failed is not None
            else f"skipped: {skipped.get('message', '')}"
            if skipped is not None
            else "passed"
        )
    return outcomes


@pytest.mark.parametrize("sdk", ["sie_sdk", "sie_client"], ids=["reference-sdk-unmodified", "aliased-to-sie_client"])
def test_the_reference_integration_suites_pass(sdk, suites, stack_url, tmp_path) -> None:
    python, path = suite_runtime(sdk)
    outcomes: dict[str, str] = {}
    for name, suite in suites.items():
        outcomes |= run_suite(suite, stack_url, tmp_path / f"{name}.xml", python, path)
    assert len(outcomes) == 22  # 7 LangChain, 10 LlamaIndex, 5 Chroma
    assert {test: outcome for test, outcome in outcomes.items() if outcome != "passed"} == {
        test: outcomes.get(test) for test in FAIL_ON_THE_REFERENCE
    }
