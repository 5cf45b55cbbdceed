"""Envoy's configuration for the HTTP/JSON edge, rendered from the contract's descriptor set.

One listener serves both HTTP/JSON (transcoded by Envoy's gRPC-JSON
transcoder, using the `google.api.http` paths of the protos) and native gRPC.
ConfigService calls go to the config service, every other gRPC call to the
gateway. gRPC errors come back as HTTP statuses with a JSON body; field names
are the protos' own. What the transcoder did not turn into a gRPC call gets
the same kind of JSON body from Envoy itself: 405 on a contract path with a
method it does not take (with an `allow` header), 404 anywhere else.

The transcoder buffers a whole message each way; its limits match the gRPC
message limits of the services behind it (lib/sie_common/transport.py), so an
answer the gateway may send is one Envoy can transcode.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from sie_common.errors import ERROR_DOMAIN
from sie_common.transport import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, DEFAULT_MAX_SEND_MESSAGE_BYTES

SERVICES = ("sie.v1.Inference", "sie.v1.ConfigService")
# google.rpc.Code of the JSON bodies Envoy answers with itself.
_NOT_FOUND = 5
_UNIMPLEMENTED = 12


def descriptor_path() -> Path:
    """The descriptor set generated from proto/ (shipped in the `sie` package)."""
    return Path(str(resources.files("sie") / "sie.binpb"))


def render(
    *, listen_port: int, admin_port: int, gateway: str, config: str, descriptor: Path | None = None, host: str = "127.0.0.1",
    inline_descriptor: bool = False, max_request_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
    max_response_bytes: int = DEFAULT_MAX_SEND_MESSAGE_BYTES,
) -> dict[str, Any]:
    """The Envoy bootstrap as plain data (dump it as YAML or JSON). With `inline_descriptor` the
    descriptor set travels inside the config (base64) instead of as a path Envoy reads.

    `max_request_bytes` / `max_response_bytes`: the largest HTTP body the transcoder takes (larger: 413)
    and the largest gRPC answer it turns into JSON; keep them at the services' SIE_MAX_RECEIVE_MESSAGE_BYTES
    and SIE_MAX_SEND_MESSAGE_BYTES."""
    descriptor = descriptor or descriptor_path()
    descriptor_bytes = descriptor.read_bytes()
    source = {"proto_descriptor_bin": base64.b64encode(descriptor_bytes).decode()} if inline_descriptor else {"proto_descriptor": str(descriptor)}
    transcoder = {
        **source,
        "services": list(SERVICES),
        "convert_grpc_status": True,
        "print_options": {"preserve_proto_field_names": True, "always_print_primitive_fields": True},
        "max_request_body_size": max_request_bytes,
        "max_response_body_size": max_response_bytes,
    }
    return {
        "admin": {"address": _address(host, admin_port)},
        "static_resources": {
            "listeners": [{
                "name": "sie",
                "address": _address(host, listen_port),
                # A second Envoy (another stack, an orphan) must fail to bind, not share the port.
                "enable_reuse_port": False,
                "filter_chains": [{"filters": [_http_connection_manager(transcoder, _http_bindings(descriptor_bytes))]}],
            }],
            "clusters": [_cluster("gateway", gateway), _cluster("config", config)],
        },
    }


def _http_connection_manager(transcoder: dict[str, Any], bindings: dict[str, list[str]]) -> dict[str, Any]:
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
                        # Matched after transcoding, on the gRPC path: only gRPC calls reach the services.
                        {"match": {"prefix": "/sie.v1.ConfigService/", "grpc": {}}, "route": {"cluster": "config", "timeout": "0s"}},
                        {"match": {"prefix": "/", "grpc": {}}, "route": {"cluster": "gateway", "timeout": "0s"}},
                        *(_method_not_allowed(path, methods) for path, methods in bindings.items()),
                        _refusal({"prefix": "/"}, 404, _NOT_FOUND, "ROUTE_NOT_FOUND", "no HTTP route here: the paths are in docs/http.md"),
                    ],
                }],
            },
            "http_filters": [
                {
                    "name": "envoy.filters.http.grpc_json_transcoder",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
                        **transcoder,
                    },
                },
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                },
            ],
        },
    }


def _method_not_allowed(path_regex: str, methods: list[str]) -> dict[str, Any]:
    """405 for a request on a contract path that the transcoder left alone because of its method."""
    allow = ", ".join(methods)
    match = {
        "safe_regex": {"regex": path_regex},
        "headers": [{"name": ":method", "string_match": {"safe_regex": {"regex": "|".join(methods)}}, "invert_match": True}],
    }
    route = _refusal(match, 405, _UNIMPLEMENTED, "METHOD_NOT_ALLOWED", f"this path takes {allow} only", {"allow": allow})
    route["response_headers_to_add"].append(_header("allow", allow))
    return route


def _refusal(
    match: dict[str, Any], status: int, code: int, reason: str, message: str, metadata: dict[str, str] | None = None
) -> dict[str, Any]:
    """A route Envoy answers itself, with the JSON error body the transcoder gives gRPC errors."""
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": ERROR_DOMAIN, "metadata": metadata or {}}
    body = json.dumps({"code": code, "message": message, "details": [info]})
    return {
        "match": match,
        "direct_response": {"status": status, "body": {"inline_string": body}},
        "response_headers_to_add": [_header("content-type", "application/json")],
    }


def _header(key: str, value: str) -> dict[str, Any]:
    return {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


def _http_bindings(descriptor_set: bytes) -> dict[str, list[str]]:
    """Path regex -> the HTTP methods the transcoder maps on it, from the services' google.api.http rules."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file
    bindings: dict[str, list[str]] = {}
    for file in files:
        for service in file.service:
            if f"{file.package}.{service.name}" not in SERVICES:
                continue
            for method in service.method:
                for verb, template in _rules(method.options.Extensions[annotations_pb2.http]):
                    methods = bindings.setdefault(_path_regex(template), [])
                    if verb not in methods:
                        methods.append(verb)
    return bindings


def _rules(rule: Any) -> Iterator[tuple[str, str]]:
    pattern = rule.WhichOneof("pattern")
    if pattern == "custom":
        yield rule.custom.kind.upper(), rule.custom.path
    elif pattern is not None:
        yield pattern.upper(), getattr(rule, pattern)
    for extra in rule.additional_bindings:
        yield from _rules(extra)


def _path_regex(template: str) -> str:
    """A google.api.http path template as a regex over the whole path: `*` one segment, `**` the rest."""
    template = re.sub(r"\{[^}=]+\}", "*", template)  # {name} is {name=*}
    template = re.sub(r"\{[^}=]+=([^}]*)\}", r"\1", template)
    parts = re.split(r"(\*\*|\*)", template)
    return "".join(".+" if part == "**" else "[^/]+" if part == "*" else re.escape(part) for part in parts)


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
