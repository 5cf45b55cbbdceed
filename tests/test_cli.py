"""`sie-worker serve` on the command line: help, bad settings, drain on SIGTERM."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from conftest import MINILM
from sie.v1 import inference_pb2, inference_pb2_grpc
from worker_process import WorkerProcess

# Every test runs `sie-worker` as a subprocess.
pytestmark = pytest.mark.process


def sie_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "sie_worker", *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def test_help_lists_flags_with_their_variables() -> None:
    result = sie_worker("serve", "--help")
    assert result.returncode == 0
    assert "--max-batch-wait-ms" in result.stdout
    assert "SIE_MAX_BATCH_WAIT_MS" in " ".join(result.stdout.split())


def test_a_bad_variable_is_refused_by_name() -> None:
    result = sie_worker("serve", env={"SIE_MAX_BATCH_REQUESTS": "lots"})
    assert result.returncode == 2
    assert "SIE_MAX_BATCH_REQUESTS='lots'" in result.stderr


def test_an_unknown_model_in_the_filter_is_reported_and_the_rest_served(tmp_path) -> None:
    worker = WorkerProcess({"SIE_MODEL_FILTER": f"no/such,{MINILM}"}, tmp_path / "worker.log")
    try:
        worker.wait_serving()
        with grpc.insecure_channel(worker.address) as channel:
            listed = inference_pb2_grpc.InferenceStub(channel).ListModels(inference_pb2.ListModelsRequest())
        assert [model.id for model in listed.models] == [MINILM]
        [problem] = listed.config_problems
        assert problem.source == "SIE_MODEL_FILTER"
        assert problem.message.startswith("SIE_MODEL_FILTER names model 'no/such', which has no usable config here; known: ")
    finally:
        assert worker.stop() == 0


def test_sigterm_stops_the_worker_cleanly(tmp_path) -> None:
    worker = WorkerProcess({}, tmp_path / "worker.log")
    worker.wait_serving()
    assert worker.stop() == 0
    assert "draining in-flight requests" in worker.log()


def test_an_unknown_bundle_is_refused() -> None:
    result = sie_worker("serve", env={"SIE_BUNDLE": "gpu-big", "SIE_PORT": "0"})
    assert result.returncode == 1
    assert "SIE_BUNDLE='gpu-big' is not a bundle in " in result.stderr
    assert "bundles: default" in result.stderr
