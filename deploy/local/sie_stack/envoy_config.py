"""Envoy's configuration for the HTTP/JSON edge, rendered from the contract's descriptor set.

One listener serves both HTTP/JSON (transcoded by Envoy's gRPC-JSON
transcoder, using the `google.api.http` paths of the protos) and native gRPC.
ConfigService calls go to the config service, everything else to the gateway.
gRPC errors come back as HTTP statuses with a JSON body; field names are the
protos' own.
"""

from __future__ import annotations

import base64
from importlib import resources
from pathlib import Path
from typing import Any

SERVICES = ("sie.v1.Inference", "sie.v1.ConfigService")


def descriptor_path() -> Path:
    """The descriptor set generated from proto/ (shipped in the `sie` package)."""
    return Path(str(resources.files("sie") / "sie.binpb"))


def render(
    *, listen_port: int, admin_port: int, gateway: str, config: str, descriptor: Path | None = None, host: str = "127.0.0.1",
    inline_descriptor: bool = False,
) -> dict[str, Any]:
    """The Envoy bootstrap as plain data (dump it as YAML or JSON). With `inline_descriptor` the
    descriptor set travels inside the config (base64) instead of as a path Envoy reads."""
    descriptor = descriptor or descriptor_path()
    source = {"proto_descriptor_bin": base64.b64encode(descriptor.read_bytes()).decode()} if inline_descriptor else {"proto_descriptor": str(descriptor)}
    return {
        "admin": {"address": _address(host, admin_port)},
        "static_resources": {
            "listeners": [{
                "name": "sie",
                "address": _address(host, listen_port),
                "filter_chains": [{"filters": [_http_connection_manager(source)]}],
            }],
            "clusters": [_cluster("gateway", gateway), _cluster("config", config)],
        },
    }


def _http_connection_manager(descriptor_source: dict[str, str]) -> dict[str, Any]:
    return {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "sie",
            "codec_type": "AUTO",
            "route_config": {
                "virtual_hosts": [{
                    "name": "sie",
                    "domains": ["*"],
                    "routes": [
                        # Matched after transcoding, on the gRPC path.
                        {"match": {"prefix": "/sie.v1.ConfigService/"}, "route": {"cluster": "config", "timeout": "0s"}},
                        {"match": {"prefix": "/"}, "route": {"cluster": "gateway", "timeout": "0s"}},
                    ],
                }],
            },
            "http_filters": [
                {
                    "name": "envoy.filters.http.grpc_json_transcoder",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
                        **descriptor_source,
                        "services": list(SERVICES),
                        "convert_grpc_status": True,
                        "print_options": {"preserve_proto_field_names": True, "always_print_primitive_fields": True},
                    },
                },
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                },
            ],
        },
    }


def _cluster(name: str, address: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    return {
        "name": name,
        "type": "STRICT_DNS",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(host, int(port))}}]}],
        },
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}
