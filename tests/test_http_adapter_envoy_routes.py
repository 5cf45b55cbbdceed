"""Envoy's routes to the gateway's HTTP adapter, as rendered (sie_stack.envoy_config): the same code renders
`sie up`'s and the Kubernetes base's config, so both send the foreign wires there."""

from __future__ import annotations

import json

from manifests import ENVOY_ADAPTER, ENVOY_CONFIG
from sie_stack.envoy_config import ADAPTER_ROUTES, render

TRANSCODER = "envoy.filters.http.grpc_json_transcoder"


def routes(config: dict) -> list[dict]:
    (listener,) = config["static_resources"]["listeners"]
    (manager,) = listener["filter_chains"][0]["filters"]
    return manager["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]


def test_the_foreign_wires_go_to_the_adapter_untranscoded_before_the_liveness_paths() -> None:
    config = render(listen_port=8080, admin_port=9901, gateway="g:1", config="c:2", adapter="a:3")
    clusters = {cluster["name"]: cluster for cluster in config["static_resources"]["clusters"]}
    options = clusters["adapter"]["typed_extension_protocol_options"]
    assert "http_protocol_options" in json.dumps(options) and "http2" not in json.dumps(options)  # aiohttp: HTTP/1.1
    table = routes(config)
    to_adapter = [route for route in table if route.get("route", {}).get("cluster") == "adapter"]
    assert [route["match"] for route in to_adapter] == list(ADAPTER_ROUTES)
    assert all(route["typed_per_filter_config"][TRANSCODER]["disabled"] for route in to_adapter)
    assert all(route["metadata"]["filter_metadata"]["envoy.filters.http.lua"]["adapter"] for route in to_adapter)
    first_alive = next(i for i, route in enumerate(table) if route["match"].get("path") == "/health")
    assert table.index(to_adapter[-1]) < first_alive  # the reference SDK's GET /health asks for capacity
    assert table.index(to_adapter[0]) > next(i for i, route in enumerate(table) if route["match"].get("grpc") == {})


def test_without_an_adapter_there_is_no_route_to_one() -> None:
    config = render(listen_port=8080, admin_port=9901, gateway="g:1", config="c:2")
    assert "adapter" not in {cluster["name"] for cluster in config["static_resources"]["clusters"]}
    assert not [route for route in routes(config) if route.get("route", {}).get("cluster") == "adapter"]


def test_the_kubernetes_envoy_config_routes_to_the_gateways_adapter() -> None:
    config = json.loads(ENVOY_CONFIG.read_text())
    (adapter,) = [cluster for cluster in config["static_resources"]["clusters"] if cluster["name"] == "adapter"]
    endpoint = adapter["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert f"{endpoint['address']}:{endpoint['port_value']}" == ENVOY_ADAPTER
