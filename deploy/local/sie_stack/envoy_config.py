"""Envoy's configuration for the HTTP/JSON edge, rendered from the contract's descriptor set.

One listener serves both HTTP/JSON (transcoded by Envoy's gRPC-JSON
transcoder, using the `google.api.http` paths of the protos) and native gRPC.
ConfigService calls go to the config service, every other gRPC call to the
gateway. gRPC errors come back as HTTP statuses with a JSON body; field names
are the protos' own. What the transcoder did not turn into a gRPC call gets
the same kind of JSON body from Envoy itself: 405 on a contract path with a
method it does not take (with an `allow` header), 404 anywhere else. A JSON
body with a field its message lacks is refused with 400 naming it, by a Lua
filter in front of the transcoder (sie_stack.unknown_fields), since the
transcoder would drop it. `/health` and `/healthz` answer 200 while Envoy runs
(liveness); `/readyz` answers 200 only while the gateway's grpc.health.v1 says
SERVING (readiness, from Envoy's active health check of the gateway).

The transcoder buffers a whole message each way; its limits match the gRPC
message limits of the services behind it (lib/sie_common/runtime/transport.py), so an
answer the gateway may send is one Envoy can transcode.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from sie_common.edge.errors import ERROR_DOMAIN
from sie_common.runtime.settings import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, DEFAULT_MAX_SEND_MESSAGE_BYTES
from sie_stack.unknown_fields import lua_filter, template_fields, template_parts

SERVICES = ("sie.v1.Inference", "sie.v1.ConfigService")
LIVENESS_PATHS = ("/health", "/healthz")
READINESS_PATH = "/readyz"
# google.rpc.Code of the JSON bodies Envoy answers with itself.
_NOT_FOUND = 5
_UNIMPLEMENTED = 12
# Type URLs of the two filters whose names are longest.
_HTTP_CONNECTION_MANAGER = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
_GRPC_JSON_TRANSCODER = "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder"


def descriptor_path() -> Path:
    """The descriptor set generated from proto/ (shipped in the `sie` package)."""
    return Path(str(resources.files("sie") / "sie.binpb"))


def render(
    *,
    listen_port: int,
    admin_port: int,
    gateway: str,
    config: str,
    descriptor: Path | None = None,
    host: str = "127.0.0.1",
    inline_descriptor: bool = False,
    max_request_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
    max_response_bytes: int = DEFAULT_MAX_SEND_MESSAGE_BYTES,
) -> dict[str, Any]:
    """The Envoy bootstrap as plain data (dump it as YAML or JSON). With `inline_descriptor` the
    descriptor set travels inside the config (base64) instead of as a path Envoy reads.

    `max_request_bytes` / `max_response_bytes`: the largest HTTP body the transcoder takes (larger: 413)
    and the largest gRPC answer it turns into JSON; keep them at the services' SIE_MAX_RECEIVE_MESSAGE_BYTES
    and SIE_MAX_SEND_MESSAGE_BYTES."""
    descriptor = descriptor or descriptor_path()
    descriptor_bytes = descriptor.read_bytes()
    source = (
        {"proto_descriptor_bin": base64.b64encode(descriptor_bytes).decode()}
        if inline_descriptor
        else {"proto_descriptor": str(descriptor)}
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_bytes).file
    transcoder = {
        **source,
        "services": list(SERVICES),
        "convert_grpc_status": True,
        # A model id's slash may come percent-encoded (`test%2Ftiny-mean`, as encodeURIComponent writes it).
        "url_unescape_spec": "ALL_CHARACTERS",
        "print_options": {"preserve_proto_field_names": True, "always_print_primitive_fields": True},
        "max_request_body_size": max_request_bytes,
        "max_response_body_size": max_response_bytes,
    }
    return {
        "admin": {"address": _address(host, admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "sie",
                    "address": _address(host, listen_port),
                    # A second Envoy (another stack, an orphan) must fail to bind, not share the port.
                    "enable_reuse_port": False,
                    # The unknown-field check reads a whole JSON body before the transcoder does: the
                    # same limit as the transcoder's (the default, 1 MiB, would refuse larger bodies).
                    "per_connection_buffer_limit_bytes": max_request_bytes,
                    "filter_chains": [{"filters": [_http_connection_manager(transcoder, files)]}],
                }
            ],
            "clusters": [_cluster("gateway", gateway, health_checked=True), _cluster("config", config)],
        },
    }


def _http_connection_manager(
    transcoder: dict[str, Any], files: Sequence[descriptor_pb2.FileDescriptorProto]
) -> dict[str, Any]:
    bindings = _http_bindings(files)
    return {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": _HTTP_CONNECTION_MANAGER,
            "stat_prefix": "sie",
            "codec_type": "AUTO",
            "route_config": {
                "virtual_hosts": [
                    {
                        "name": "sie",
                        "domains": ["*"],
                        "routes": [
                            # Matched after transcoding, on the gRPC path: only gRPC calls reach the services.
                            {
                                "match": {"prefix": "/sie.v1.ConfigService/", "grpc": {}},
                                "route": {"cluster": "config", "timeout": "0s"},
                            },
                            {"match": {"prefix": "/", "grpc": {}}, "route": {"cluster": "gateway", "timeout": "0s"}},
                            *(_alive(path) for path in LIVENESS_PATHS),
                            *(_method_not_allowed(path, methods) for path, methods in bindings.items()),
                            _refusal(
                                {"prefix": "/"},
                                404,
                                _NOT_FOUND,
                                "ROUTE_NOT_FOUND",
                                "no HTTP route here: the paths are in docs/http.md",
                            ),
                        ],
                    }
                ],
            },
            "http_filters": [
                _readiness(),
                lua_filter(files, _checked_routes(files)),
                {
                    "name": "envoy.filters.http.grpc_json_transcoder",
                    "typed_config": {
                        "@type": _GRPC_JSON_TRANSCODER,
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
        "headers": [
            {"name": ":method", "string_match": {"safe_regex": {"regex": "|".join(methods)}}, "invert_match": True}
        ],
    }
    route = _refusal(
        match, 405, _UNIMPLEMENTED, "METHOD_NOT_ALLOWED", f"this path takes {allow} only", {"allow": allow}
    )
    route["response_headers_to_add"].append(_header("allow", allow))
    return route


def _refusal(
    match: dict[str, Any], status: int, code: int, reason: str, message: str, metadata: dict[str, str] | None = None
) -> dict[str, Any]:
    """A route Envoy answers itself, with the JSON error body the transcoder gives gRPC errors."""
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": ERROR_DOMAIN,
        "metadata": metadata or {},
    }
    body = json.dumps({"code": code, "message": message, "details": [info]})
    return {
        "match": match,
        "direct_response": {"status": status, "body": {"inline_string": body}},
        "response_headers_to_add": [_header("content-type", "application/json")],
    }


def _alive(path: str) -> dict[str, Any]:
    """Liveness: 200 while Envoy runs."""
    return {
        "match": {"path": path},
        "direct_response": {"status": 200, "body": {"inline_string": '{"status": "ok"}'}},
        "response_headers_to_add": [_header("content-type", "application/json")],
    }


def _readiness() -> dict[str, Any]:
    """Readiness on GET /readyz: 200 while the gateway passes Envoy's gRPC health check, else 503."""
    return {
        "name": "envoy.filters.http.health_check",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck",
            "pass_through_mode": False,
            "headers": [{"name": ":path", "string_match": {"exact": READINESS_PATH}}],
            "cluster_min_healthy_percentages": {"gateway": {"value": 100}},
        },
    }


def _header(key: str, value: str) -> dict[str, Any]:
    return {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


def _http_bindings(files: Sequence[descriptor_pb2.FileDescriptorProto]) -> dict[str, list[str]]:
    """Path regex -> the HTTP methods the transcoder maps on it, from the services' google.api.http rules."""
    bindings: dict[str, list[str]] = {}
    for _, verb, template, _ in _http_rules(files):
        methods = bindings.setdefault(_path_regex(template), [])
        if verb not in methods:
            methods.append(verb)
    return bindings


def _checked_routes(files: Sequence[descriptor_pb2.FileDescriptorProto]) -> list[tuple[str, str, str, list[str]]]:
    """(HTTP method, path template, the body's message or "" for none, the fields of it the path binds) of each rule."""
    messages = {f"{file.package}.{message.name}": message for file in files for message in file.message_type}
    routes: list[tuple[str, str, str, list[str]]] = []
    for method, verb, template, body in _http_rules(files):
        if not body:
            routes.append((verb, template, "", []))
            continue
        message = method.input_type.lstrip(".")
        in_path = template_fields(template)
        if body != "*":
            message = next(f for f in messages[message].field if f.name == body).type_name.lstrip(".")
            in_path = []
        routes.append((verb, template, message, in_path))
    return routes


def _http_rules(
    files: Sequence[descriptor_pb2.FileDescriptorProto],
) -> Iterator[tuple[descriptor_pb2.MethodDescriptorProto, str, str, str]]:
    """(RPC, HTTP method, path template, body) of every google.api.http rule of the transcoded services."""
    for file in files:
        for service in file.service:
            if f"{file.package}.{service.name}" not in SERVICES:
                continue
            for method in service.method:
                for verb, template, body in _rules(method.options.Extensions[annotations_pb2.http]):
                    yield method, verb, template, body


def _rules(rule: Any) -> Iterator[tuple[str, str, str]]:
    pattern = rule.WhichOneof("pattern")
    if pattern == "custom":
        yield rule.custom.kind.upper(), rule.custom.path, rule.body
    elif pattern is not None:
        yield pattern.upper(), getattr(rule, pattern), rule.body
    for extra in rule.additional_bindings:
        yield from _rules(extra)


def _path_regex(template: str) -> str:
    """A google.api.http path template as a regex over the whole path: `*` one segment, `**` the rest."""
    return "".join(
        ".+" if part == "**" else "[^/]+" if part == "*" else re.escape(part) for part in template_parts(template)
    )


def _cluster(name: str, address: str, health_checked: bool = False) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    checks = [
        {"timeout": "1s", "interval": "2s", "unhealthy_threshold": 1, "healthy_threshold": 1, "grpc_health_check": {}}
    ]
    return {
        **({"health_checks": checks} if health_checked else {}),
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
