"""The same client calls made with the reference SDK (run in its own venv: `python reference_sdk_calls.py sie_sdk
BASE_URL CALLS`) or with sie_client (`answers("sie_client", ...)`), their answers as JSON, so a test can compare the
reference SDK over its own wire (the gateway's HTTP adapter) with sie_client over gRPC, value for value.

CALLS is a JSON list of [name, method, args, kwargs]; an answer is the result with numpy arrays as
{"array", "dtype", "shape"}, or {"raises": class name, "code", "status_code"} for an error."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import numpy as np


def plain(value: Any) -> Any:
    """`value` as JSON: arrays spelled out with their dtype and shape, mappings and sequences recursively."""
    if isinstance(value, np.ndarray):
        return {
            "array": value.astype(np.float64).round(5).tolist(),
            "dtype": str(value.dtype),
            "shape": list(value.shape),
        }
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def answers(package: str, base_url: str, calls: list[list[Any]], api_key: str | None = None) -> dict[str, Any]:
    client_module = importlib.import_module(package)
    results: dict[str, Any] = {}
    client = client_module.SIEClient(base_url, api_key=api_key) if api_key else client_module.SIEClient(base_url)
    try:
        for name, method, args, kwargs in calls:
            try:
                target = client
                for part in method.split("."):  # "jobs.list": a namespace's method
                    target = getattr(target, part)
                results[name] = plain(target(*args, **kwargs))
            except Exception as error:  # noqa: BLE001 (which error is what is compared)
                results[name] = {
                    "raises": type(error).__name__,
                    "code": getattr(error, "code", None) if isinstance(getattr(error, "code", None), str) else None,
                    "status_code": getattr(error, "status_code", None),
                    "message": str(error)[:300],
                }
    finally:
        client.close()
    return results


if __name__ == "__main__":
    key = sys.argv[4] if len(sys.argv) > 4 else None
    json.dump(answers(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), key), sys.stdout)
