"""A person with grpcurl: list services through reflection, check health, encode."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import MINILM

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or "grpcurl"


def grpcurl(address: str, *args: str) -> str:
    result = subprocess.run([GRPCURL, "-plaintext", *args[:-1], address, args[-1]], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_reflection_lists_the_services(worker) -> None:
    services = grpcurl(worker.address, "list").split()
    assert {"sie.v1.Inference", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(services)


def test_health_is_serving(worker) -> None:
    reply = json.loads(grpcurl(worker.address, "-d", '{"service": "sie.v1.Inference"}', "grpc.health.v1.Health/Check"))
    assert reply == {"status": "SERVING"}


def test_encode_with_grpcurl(worker) -> None:
    body = json.dumps({"model": MINILM, "items": [{"id": "doc-1", "text": "hello from grpcurl"}]})
    reply = json.loads(grpcurl(worker.address, "-d", body, "sie.v1.Inference/Encode"))
    result = reply["results"][0]
    assert result["id"] == "doc-1"
    assert result["dense"]["dtype"] == "float32"
    assert result["dense"]["shape"] == [384]
    assert set(reply["timing"]) >= {"queue_ms", "tokenization_ms", "inference_ms", "postprocessing_ms", "total_ms"}
