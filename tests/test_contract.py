"""The contract in proto/: stubs in sync, buf lint clean, buf breaking wired up."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# buf, protoc and git run as subprocesses.
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
PROTOS = [sys.executable, str(ROOT / "tools" / "protos.py")]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PROTOS, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_generated_stubs_match_the_protos() -> None:
    result = run("check")
    assert result.returncode == 0, result.stderr


def test_drift_is_detected(tmp_path: Path) -> None:
    """A stale stub fails the check: the check compares bytes, not just names."""
    import protos

    fresh = tmp_path / "fresh"
    protos.generate(fresh)
    stale = tmp_path / "stale"
    shutil.copytree(fresh, stale)
    (stale / "sie" / "v1" / "types_pb2.py").write_text("# edited by hand\n")
    assert protos._compare(fresh, stale) == ["sie/v1/types_pb2.py"]


def test_buf_lint_is_clean() -> None:
    result = run("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_runs_against_the_committed_contract() -> None:
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout with commits")
    result = run("breaking", "HEAD")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rpc_of_the_contract_is_present() -> None:
    from sie.v1 import config_pb2, inference_pb2, worker_pb2

    inference = inference_pb2.DESCRIPTOR.services_by_name["Inference"].methods_by_name
    assert set(inference) == {
        "Encode", "Score", "Extract", "EncodeStream", "CreateEmbeddings", "ListModels", "GetModel", "DescribeModel",
        "CreatePool", "GetPool", "ListPools", "RenewPool", "DeletePool",
    }
    stream = inference["EncodeStream"]
    assert stream.client_streaming and stream.server_streaming
    config = config_pb2.DESCRIPTOR.services_by_name["ConfigService"].methods_by_name
    assert set(config) == {"AddModel", "GetModelConfig", "ListModelConfigs", "ExportConfigs", "GetEpoch", "ListBundles", "GetBundle"}
    work = worker_pb2.DESCRIPTOR.services_by_name["Worker"].methods_by_name["Work"]
    assert work.client_streaming and work.server_streaming


def test_buf_breaking_catches_a_removed_field(tmp_path: Path) -> None:
    import protos

    before, after = tmp_path / "before", tmp_path / "after"
    for workspace in (before, after):
        shutil.copytree(ROOT / "proto", workspace / "proto")
        shutil.copy(ROOT / "buf.yaml", workspace / "buf.yaml")
    types = after / "proto" / "sie" / "v1" / "types.proto"
    types.write_text(types.read_text().replace("  double queue_ms = 1;\n", ""))
    assert protos.breaking_between(after, before) != 0
    assert protos.breaking_between(before, before) == 0
