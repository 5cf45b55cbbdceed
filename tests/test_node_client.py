"""A Node client loads the contract from proto/ (@grpc/grpc-js + @grpc/proto-loader) and encodes through the gateway."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edge_helpers import MEAN as MODEL
from edge_helpers import Edge
from sie_client import SIEClient

ROOT = Path(__file__).resolve().parents[1]
NODE_DIR = ROOT / "tests" / "node"
TEXTS = ["a node client", "calls the gateway", "with ünïcödé"]


@pytest.fixture(scope="module")
def node_modules() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    workdir = ROOT / "build" / "node-client"
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(NODE_DIR / "package.json", workdir / "package.json")
    if not (workdir / "node_modules" / "@grpc" / "proto-loader").exists():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=workdir, check=True, timeout=300)
    return workdir / "node_modules"


def include_dirs() -> list[str]:
    """Where the googleapis and well-known protos the contract imports live (installed Python packages)."""
    import google.api.annotations_pb2 as annotations
    import grpc_tools

    return [str(Path(annotations.__file__).resolve().parents[2]), str(Path(grpc_tools.__file__).parent / "_proto")]


def test_node_embeddings_equal_the_python_clients(node_modules: Path, edge: Edge) -> None:
    """Through the shared edge's gateway (its worker has MODEL loaded)."""
    gateway = edge.gateway
    result = subprocess.run(
        ["node", str(NODE_DIR / "encode.js"), gateway.address, MODEL, *include_dirs()],
        input=json.dumps(TEXTS), capture_output=True, text=True, timeout=120,
        env={"NODE_PATH": str(node_modules), "PATH": __import__("os").environ["PATH"]},
    )
    assert result.returncode == 0, result.stderr
    from_node = json.loads(result.stdout)
    with SIEClient(gateway.address) as client:
        from_python = client.encode(MODEL, TEXTS)
    for index, expected in enumerate(from_python):
        np.testing.assert_allclose(np.asarray(from_node[str(index)], dtype=np.float32), expected["dense"], atol=1e-6)
