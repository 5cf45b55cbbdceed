"""The Kubernetes Envoy gets the same edge as `sie up` (tools/manifests.py renders it with the same code) and its
memory bounds fit its container: the overload manager's heap limit leaves room under the memory limit, and Envoy
runs with the worker threads the body budget is split over."""

from __future__ import annotations

import json

import yaml
from manifests import ENVOY_CONFIG, KUSTOMIZE_DIR, envoy_config

from sie_stack.envoy_config import WORKER_THREADS

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def envoy_container() -> dict:
    documents = yaml.safe_load_all((KUSTOMIZE_DIR / "base" / "envoy" / "envoy.yaml").read_text())
    deployment = next(doc for doc in documents if doc and doc["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_the_heap_limit_fits_the_containers_memory_limit() -> None:
    limit = envoy_container()["resources"]["limits"]["memory"]
    limit_bytes = int(limit[:-2]) * UNITS[limit[-2:]]
    config = json.loads(ENVOY_CONFIG.read_text())
    (heap,) = [m for m in config["overload_manager"]["resource_monitors"] if m["name"].endswith("fixed_heap")]
    assert heap["typed_config"]["max_heap_size_bytes"] <= limit_bytes * 3 // 4


def test_envoy_runs_with_the_threads_its_body_budget_is_split_over() -> None:
    args = envoy_container()["args"]
    assert args[args.index("--concurrency") + 1] == str(WORKER_THREADS)


def test_the_kubernetes_edge_has_every_check_of_the_local_one() -> None:
    config = envoy_config()
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert (manager["normalize_path"], manager["merge_slashes"]) == (True, True)
    assert manager["path_with_escaped_slashes_action"] == "UNESCAPE_AND_FORWARD"
    assert manager["request_headers_timeout"] and manager["request_timeout"] and manager["local_reply_config"]["mappers"]
    names = [f["name"] for f in manager["http_filters"]]
    assert names == [
        "envoy.filters.http.health_check",
        "envoy.filters.http.lua",
        "envoy.filters.http.grpc_json_transcoder",
        "envoy.filters.http.lua",
        "envoy.filters.http.router",
    ]
