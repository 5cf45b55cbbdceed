"""Envoy's configuration for the HTTP/JSON edge, rendered from the contract's descriptor set.

One listener serves both HTTP/JSON (transcoded by Envoy's gRPC-JSON
transcoder, using the `google.api.http` paths of the protos) and native gRPC.
ConfigService calls go to the config service, every other gRPC call to the
gateway. gRPC errors come back as HTTP statuses with a JSON body; field names
are the protos' own. What the transcoder did not turn into a gRPC call gets
the same kind of JSON body from Envoy itself: 405 on a contract path with a
method it does not take (with an `allow` header), 404 anywhere else; and so
do Envoy's own local replies (no healthy upstream, a reset, a timeout,
overload, a body over the limit), through the local-reply mappers.

Paths are normalised before anything reads them (dot segments removed,
duplicate slashes merged, `%2F` unescaped; sie_stack.request_check drops a
trailing slash). A Lua filter in front of the transcoder refuses what the
contract refuses and the transcoder would take (sie_stack.request_check: an
unknown field, a wrong JSON type, non-strict JSON, a query string), and one
behind it lets a request reach a service only for the RPC the check chose.
`/health` and `/healthz` answer 200 while Envoy runs (liveness); `/readyz`
answers 200 only while the gateway's grpc.health.v1 says SERVING (readiness,
from Envoy's active health check of the gateway).

With `adapter` set, other clients' protocols go to the gateway's HTTP adapter
(sie_gateway.http_adapter) untranscoded (ADAPTER_ROUTES): the reference SDK's
wire (its `X-SIE-SDK-Version` header, or msgpack sent or accepted on /v1/),
Cohere/Jina rerank, TEI under /tei/, and GET /v1/models for everyone (our
listing with OpenAI's keys added). The request check keeps its path, size and
time bounds for them and leaves their bodies to the adapter's own bounds.

The transcoder buffers a whole message each way; its limits match the gRPC
message limits of the services behind it (lib/sie_common/runtime/transport.py), so an
answer the gateway may send is one Envoy can transcode. Envoy's memory is
bounded by an overload manager (`max_heap_bytes`, sized to the Kubernetes
container limit), a connection limit, HTTP/2 stream limits, and request
timeouts a slow sender cannot renew (docs/security.md, "Envoy").
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

from sie_common.edge.auth import CLIENT_ADDRESS_HEADER
from sie_common.edge.errors import ERROR_DOMAIN, InvalidArgument, SieError, Unavailable
from sie_common.runtime.settings import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, DEFAULT_MAX_SEND_MESSAGE_BYTES
from sie_stack.request_check import (
    FEW_CHUNKS,
    LUA_FILTER_NAME,
    METADATA_NAMESPACE,
    MIN_CHUNK_BYTES,
    BodyAdmission,
    CheckedRoute,
    lua_filters,
    template_fields,
    template_parts,
)

SERVICES = ("sie.v1.Inference", "sie.v1.ConfigService")
LIVENESS_PATHS = ("/health", "/healthz")
READINESS_PATH = "/readyz"
# google.rpc.Code of the JSON bodies Envoy answers with itself.
_NOT_FOUND = 5
_UNIMPLEMENTED = 12
# Reasons and messages of answers given in more than one place.
_ROUTE_NOT_FOUND = ("ROUTE_NOT_FOUND", "no HTTP route here: the paths are in docs/http.md")
_BODIES_OVERLOADED = ("OVERLOADED", "Envoy holds as many request bodies as it may just now; retry")
# A grpc-timeout header that is not gRPC's TimeoutValue TimeoutUnit (1 to 8 digits, then one of H M S m u n): passed on,
# the gateway's grpc reset the stream, which a caller heard as INTERNAL.
_BAD_TIMEOUT = (
    "INVALID_TIMEOUT",
    "the grpc-timeout header must be 1 to 8 digits and a unit (H, M, S, m, u or n), as gRPC writes it (e.g. 500m)",
)
_BODY_TOO_LARGE = (
    "BODY_TOO_LARGE",
    "the body is larger than the edge takes (sie envoy-config --max-request-bytes, the services' "
    "SIE_MAX_RECEIVE_MESSAGE_BYTES): send fewer or smaller items per request",
)
# Type URLs of the two filters whose names are longest.
_HTTP_CONNECTION_MANAGER = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
_GRPC_JSON_TRANSCODER = "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder"
_FIXED_HEAP = "envoy.resource_monitors.fixed_heap"
# A request as native gRPC sends it (the transcoder leaves it alone; one it transcodes has TRANSCODED_HEADER), as Envoy
# and the request check take it (request_check.lua's is_native): application/grpc or application/grpc+...; grpc-web
# and "application/grpc; charset=utf-8" are HTTP callers, answered with the JSON body.
_GRPC_CONTENT_TYPE = {"name": "content-type", "string_match": {"safe_regex": {"regex": r"application/grpc(\+.*)?"}}}
# The header the transcoder adds with the HTTP path (which tells the gateway the caller reads JSON).
TRANSCODED_HEADER = "x-envoy-original-path"
_MAX_CONNECTIONS = "envoy.resource_monitors.global_downstream_max_connections"
# google.rpc.Code of the other JSON bodies Envoy answers with itself.
_INVALID_ARGUMENT = 3
_DEADLINE_EXCEEDED = 4
_UNAVAILABLE = 14
_INTERNAL = 13

# Envoy's memory (docs/security.md, "Envoy"): its heap, which the overload manager keeps under the heap limit, and
# what tcmalloc does not count: the request check's Lua memory (the JSON bodies it holds while they arrive, at most
# the body budget, BODY_BUDGET_SHARE of the heap limit, and a working copy of one body per thread), thread stacks,
# the binary. 384 MiB of heap, 128 MiB of bodies and about 90 MiB more fit the Kubernetes base's 640 MiB limit.
DEFAULT_MAX_HEAP_BYTES = 384 * 2**20
BODY_BUDGET_SHARE = 1 / 3
DEFAULT_MAX_CONNECTIONS = 1024
# The share of the connection limit from which every connection (and stream) idle for 2 s is closed: the rest of the
# limit stays free for new callers however many idle connections an attacker opens.
CROWDED_SHARE = 0.9
# Envoy's worker threads (its --concurrency; `sie up` and the Kubernetes base pass it): the body budget is split over
# them (each thread's Lua state has its own).
WORKER_THREADS = 2
# The share of the JSON body budget the bodies of one client address may hold at once.
DEFAULT_PEER_BODY_SHARE = 0.5
# JSON bodies one worker thread receives at once (the same share of them for one client address): a request waiting for
# its body costs Envoy some 30 KB of heap however little it sends (3,000 HTTP/2 streams announcing bodies took 78 MB).
MAX_BODIES_PER_THREAD = 1024
# Requests (streams) at once on one HTTP/2 connection: each may buffer a whole body.
MAX_CONCURRENT_STREAMS = 100
# What Envoy reads from a connection at once, what an HTTP/2 client may send on a stream or a connection before Envoy
# passes it on (its flow-control windows), and what a stream buffers on its way through (a native gRPC call, a body to
# the HTTP adapter): each Envoy worker thread holds one read, and the request check's copy of it, at a time. Bodies the
# check and the transcoder hold whole are not held to it (the check keeps a JSON body in its Lua memory, leased from
# the body budget; a body of max_request_bytes passes, over HTTP/1 and HTTP/2: tests/reliability/test_envoy_buffers.py).
CONNECTION_BUFFER_BYTES = 2**20
# An HTTP/2 stream's flow-control window: what a client may send on one stream before Envoy has passed it on (Envoy's
# default, 256 MiB, let a native call's whole message sit in Envoy). The edge values Envoy's own guidance gives.
STREAM_WINDOW_BYTES = 2**16
# What Envoy returns to the system each quarter second of the free memory tcmalloc holds.
MEMORY_RELEASE_BYTES = 64 * 2**20
# A request's headers, and the whole request, must arrive within these (from its first byte; neither is renewed by
# more bytes). A native gRPC stream is exempt from the second once its first answer is on its way.
REQUEST_HEADERS_TIMEOUT = "10s"
REQUEST_TIMEOUT = "60s"
# A request's headers (the path with them), in KiB: what Envoy passes on becomes gRPC metadata (the path as
# x-envoy-original-path, which tells the gateway the caller reads JSON), and grpc refuses metadata past 8 KiB at
# random and past 16 KiB always, with RESOURCE_EXHAUSTED (HTTP 429, which invites retries).
# The request check refuses them past this (431 HEADERS_TOO_LARGE; to a native gRPC call INVALID_ARGUMENT), counted as
# HTTP/2 and grpc count a header list (name, value and 32 bytes each); Envoy's codecs take up to CODEC_HEADERS_KIB, so
# that the check sees them: past that, or past MAX_REQUEST_HEADERS fields, an HTTP/1 request gets 431 from the codec
# and HTTP/2's codec resets the stream before any filter or local reply runs (9 KB of metadata on a native call was
# such a reset, INTERNAL to the caller, when the codec's limit was this one).
MAX_REQUEST_HEADERS_KIB = 7
CODEC_HEADERS_KIB = 32
# A request's header fields at most (Envoy's default, written out).
MAX_REQUEST_HEADERS = 100
# Their refusal, by the request check or the HTTP/1 codec.
_HEADERS_TOO_LARGE = (
    "HEADERS_TOO_LARGE",
    f"the request's headers exceed {MAX_REQUEST_HEADERS} fields or {MAX_REQUEST_HEADERS_KIB} KiB (name, value and 32 "
    "bytes each, as HTTP/2 counts them), the path counted (they travel on as gRPC metadata): send fewer or shorter "
    "headers",
)
# A stream, and a connection without streams, with no bytes either way for this long are closed.
STREAM_IDLE_TIMEOUT = "300s"
CONNECTION_IDLE_TIMEOUT = "300s"


def descriptor_path() -> Path:
    """The descriptor set generated from proto/ (shipped in the `sie` package)."""
    return Path(str(resources.files("sie") / "sie.binpb"))


def render(
    *,
    listen_port: int,
    admin_port: int,
    gateway: str,
    config: str,
    adapter: str | None = None,
    descriptor: Path | None = None,
    host: str = "127.0.0.1",
    inline_descriptor: bool = False,
    max_request_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
    max_response_bytes: int = DEFAULT_MAX_SEND_MESSAGE_BYTES,
    max_heap_bytes: int = DEFAULT_MAX_HEAP_BYTES,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    worker_threads: int = WORKER_THREADS,
    peer_body_share: float = DEFAULT_PEER_BODY_SHARE,
) -> dict[str, Any]:
    """The Envoy bootstrap as plain data (dump it as YAML or JSON). With `inline_descriptor` the
    descriptor set travels inside the config (base64) instead of as a path Envoy reads.

    `max_request_bytes` / `max_response_bytes`: the largest HTTP body the transcoder takes (larger: 413)
    and the largest gRPC answer it turns into JSON; keep them at the services' SIE_MAX_RECEIVE_MESSAGE_BYTES
    and SIE_MAX_SEND_MESSAGE_BYTES. `max_heap_bytes`: the heap the overload manager keeps Envoy under (with a third
    of it again for the JSON bodies the request check holds, outside that heap: about 60% of its container's memory
    limit); `max_connections`: downstream connections at once; `worker_threads`: the --concurrency Envoy runs with;
    `peer_body_share`: the share of the body budget one client address may hold (behind a proxy that hides client
    addresses, all callers are one). `adapter`: the gateway's HTTP adapter (host:port), which serves the foreign
    wires (ADAPTER_ROUTES); without it those paths are 404 as any other."""
    descriptor = descriptor or descriptor_path()
    descriptor_bytes = descriptor.read_bytes()
    source = (
        {"proto_descriptor_bin": base64.b64encode(descriptor_bytes).decode()}
        if inline_descriptor
        else {"proto_descriptor": str(descriptor)}
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_bytes).file
    if not 0 < peer_body_share <= 1:
        raise ValueError(f"peer_body_share must be in (0, 1], not {peer_body_share}")
    budget = int(max_heap_bytes * BODY_BUDGET_SHARE) // worker_threads
    # A body must fit what one peer may hold and what large bodies may hold together (request_check.lua's LARGE_BUDGET,
    # three quarters): one that never could would be refused 503 OVERLOADED with retry-after on an idle Envoy, for ever.
    room = min(int(budget * peer_body_share), budget * 3 // 4)
    if room < max_request_bytes:
        raise ValueError(
            f"a body of max_request_bytes ({max_request_bytes}) would never fit the {room} bytes one client may hold "
            f"of a thread's body budget (a third of max_heap_bytes over {worker_threads} threads, times "
            "peer_body_share and at most three quarters): raise max_heap_bytes or peer_body_share, or lower "
            "max_request_bytes"
        )
    admission = BodyAdmission(
        limit=max_request_bytes,
        budget=budget,
        peer_budget=int(budget * peer_body_share),
        bodies=MAX_BODIES_PER_THREAD,
        peer_bodies=max(1, int(MAX_BODIES_PER_THREAD * peer_body_share)),
        lease_s=_seconds(REQUEST_TIMEOUT) + 5,
    )
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
        # Loopback only, whatever `host` is: the admin can stop Envoy and fail its health; probes use the listener's
        # /readyz, and a pod's preStop drains through the admin from inside (deploy/kustomize/base/envoy/drain.sh).
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "overload_manager": _overload_manager(max_heap_bytes, max_connections),
        # Free memory goes back to the system as it is freed, not only past 90% (shrink_heap): the heap monitor counts
        # what tcmalloc keeps mapped, and 64 native 16 MB calls through Envoy, most refused by the gateway at once,
        # left 266 MiB counted with 7 MiB in use.
        "memory_allocator_manager": {"bytes_to_release": MEMORY_RELEASE_BYTES, "memory_release_interval": "0.25s"},
        "static_resources": {
            "listeners": [
                {
                    "name": "sie",
                    "address": _address(host, listen_port),
                    # A second Envoy (another stack, an orphan) must fail to bind, not share the port.
                    "enable_reuse_port": False,
                    # What one read from a connection takes in before the filters see it (and an HTTP/1 stream's
                    # buffer): a worker thread holds one such read and the check's copy of it at a time, so this
                    # bounds what slow senders cost Envoy's heap (16 MiB, as it was, let 30 of them grow it by 34 MB).
                    "per_connection_buffer_limit_bytes": CONNECTION_BUFFER_BYTES,
                    # Connections spread evenly over the worker threads (by default the first to wake takes them, most
                    # often the same one): each thread has its own share of the body budget.
                    "connection_balance_config": {"exact_balance": {}},
                    "filter_chains": [
                        {"filters": [_http_connection_manager(transcoder, files, admission, adapter is not None)]}
                    ],
                }
            ],
            "clusters": [
                _cluster("gateway", gateway, health_checked=True),
                _cluster("config", config),
                *([_cluster("adapter", adapter, http2=False)] if adapter else []),
            ],
        },
    }


def _http_connection_manager(
    transcoder: dict[str, Any],
    files: Sequence[descriptor_pb2.FileDescriptorProto],
    admission: BodyAdmission,
    adapter: bool,
) -> dict[str, Any]:
    bindings = _http_bindings(files)
    not_found = _refusal({"prefix": "/"}, 404, _NOT_FOUND, *_ROUTE_NOT_FOUND)
    answers = {
        "NOT_FOUND": not_found["direct_response"]["body"]["inline_string"],
        "CHECK_FAILED": _error_json(_INTERNAL, "EDGE_ERROR", "the request check failed to say; nothing went on"),
        "OVERLOADED": _error_json(_UNAVAILABLE, *_BODIES_OVERLOADED),
        "BAD_TIMEOUT": _error_json(_INVALID_ARGUMENT, *_BAD_TIMEOUT),
        "BAD_TIMEOUT_MESSAGE": _BAD_TIMEOUT[1],
        "HEADERS_TOO_LARGE": _error_json(_INVALID_ARGUMENT, *_HEADERS_TOO_LARGE),
        "HEADERS_TOO_LARGE_MESSAGE": _HEADERS_TOO_LARGE[1],
        "HEADERS_TOO_LARGE_DETAILS": _status_details(
            InvalidArgument(_HEADERS_TOO_LARGE[1], reason=_HEADERS_TOO_LARGE[0])
        ),
        # The same refusal to a native gRPC caller: its google.rpc.Status, as grpc-status-details-bin carries it.
        "BAD_TIMEOUT_DETAILS": _status_details(InvalidArgument(_BAD_TIMEOUT[1], reason=_BAD_TIMEOUT[0])),
    }
    check, guard = lua_filters(files, _checked_routes(files), answers, admission, MAX_REQUEST_HEADERS_KIB * 1024)
    return {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": _HTTP_CONNECTION_MANAGER,
            "stat_prefix": "sie",
            "codec_type": "AUTO",
            # One spelling of each path for every filter and the route table: dot segments removed, `//` merged,
            # %2F and %5C unescaped (a model id's slash may come as encodeURIComponent writes it).
            "normalize_path": True,
            "merge_slashes": True,
            "path_with_escaped_slashes_action": "UNESCAPE_AND_FORWARD",
            "max_request_headers_kb": CODEC_HEADERS_KIB,
            "request_headers_timeout": REQUEST_HEADERS_TIMEOUT,
            "request_timeout": REQUEST_TIMEOUT,
            "stream_idle_timeout": STREAM_IDLE_TIMEOUT,
            "common_http_protocol_options": {
                "idle_timeout": CONNECTION_IDLE_TIMEOUT,
                "max_headers_count": MAX_REQUEST_HEADERS,
            },
            "http2_protocol_options": {
                "max_concurrent_streams": MAX_CONCURRENT_STREAMS,
                # A stream with a malformed header (an upper-case name, a connection-specific header) is reset alone;
                # by default Envoy ends the connection, and every call in flight on a shared gRPC channel with it.
                "override_stream_error_on_invalid_http_message": True,
                # What a client may send on a stream, and on a connection, before Envoy has passed it on.
                **_http2_windows(),
            },
            "local_reply_config": _local_replies(),
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
                            {
                                "match": {"prefix": "/", "grpc": {}},
                                "route": {"cluster": "gateway", "timeout": "0s"},
                                # The gateway's key for a caller without a token (its request-bytes budget).
                                "request_headers_to_add": [_client_address()],
                            },
                            *(_adapter_routes() if adapter else []),
                            *(_alive(path) for path in LIVENESS_PATHS),
                            *(_method_not_allowed(path, methods) for path, methods in bindings.items()),
                            not_found,
                        ],
                    }
                ],
            },
            "http_filters": [
                _readiness(),
                check,
                {
                    "name": "envoy.filters.http.grpc_json_transcoder",
                    "typed_config": {
                        "@type": _GRPC_JSON_TRANSCODER,
                        **transcoder,
                    },
                },
                guard,
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                },
            ],
        },
    }


# What Envoy sends to the HTTP adapter, in order (docs/http.md, "Other clients' protocols"): the reference SDK's
# requests (its header on any path; msgpack sent or accepted on /v1/), Cohere/Jina rerank, TEI's routes per model,
# and GET /v1/models[/{model}] (our listing with OpenAI's keys). Matched before the liveness paths: the reference
# SDK's GET /health asks for capacity.
REFERENCE_SDK_HEADER = "x-sie-sdk-version"
# What Envoy writes in CLIENT_ADDRESS_HEADER: the connection's own peer, not x-forwarded-for (any client may send one).
CLIENT_ADDRESS = "%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%"
MSGPACK = "application/msgpack"
ADAPTER_ROUTES: tuple[dict[str, Any], ...] = (
    {"prefix": "/", "headers": [{"name": REFERENCE_SDK_HEADER, "present_match": True}]},
    {"prefix": "/v1/", "headers": [{"name": "content-type", "string_match": {"prefix": MSGPACK}}]},
    {"prefix": "/v1/", "headers": [{"name": "accept", "string_match": {"contains": MSGPACK}}]},
    {"path": "/v1/rerank"},
    {"path": "/v2/rerank"},
    {"prefix": "/tei/"},
    {"path": "/v1/models", "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
    {"prefix": "/v1/models/", "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
)


def _client_address() -> dict[str, Any]:
    """CLIENT_ADDRESS_HEADER set to the connection's own peer, over any value the client sent."""
    return {
        "header": {"key": CLIENT_ADDRESS_HEADER, "value": CLIENT_ADDRESS},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }


def _adapter_routes() -> list[dict[str, Any]]:
    """ADAPTER_ROUTES to the adapter cluster, untranscoded (the transcoder is off on them)."""
    return [
        {
            "match": match,
            "route": {"cluster": "adapter", "timeout": "0s"},
            # request_check.lua reads it to leave the body to the adapter's own bounds.
            "metadata": {"filter_metadata": {LUA_FILTER_NAME: {"adapter": True}}},
            # The client's address, over any the client sent: the adapter's key for the share of its body budget a
            # caller without a token may hold.
            "request_headers_to_add": [_client_address()],
            "typed_per_filter_config": {
                "envoy.filters.http.grpc_json_transcoder": {
                    "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                    "disabled": True,
                }
            },
        }
        for match in ADAPTER_ROUTES
    ]


def _overload_manager(max_heap_bytes: int, max_connections: int) -> dict[str, Any]:
    """Past 85% of `max_heap_bytes` idle timeouts shrink; at 90% keep-alive stops and the heap is returned to the
    system; at 95% new requests are refused (503 OVERLOADED; UNAVAILABLE OVERLOADED to native gRPC). No stream is
    reset for memory (reset_high_memory_stream): a native gRPC caller heard a reset as INTERNAL; what a stream holds
    is bounded by CONNECTION_BUFFER_BYTES and STREAM_WINDOW_BYTES instead. From CROWDED_SHARE of `max_connections`
    idle timeouts are 2 s, until fewer are open; connections past it are closed on accept."""

    def at(threshold: float) -> list[dict[str, Any]]:
        return [{"name": _FIXED_HEAP, "threshold": {"value": threshold}}]

    scaled = [{"name": _FIXED_HEAP, "scaled": {"scaling_threshold": 0.85, "saturation_threshold": 0.95}}]
    # Idle connections hold no heap but do hold places: 1024 that never sent a byte kept every new caller out for the
    # 300 s idle timeout. A threshold, not a scale: scaled from half the limit, the timeouts stretched back as the count
    # fell, so how many idle connections stayed depended on when the overload manager looked (47 of 64 in a busy CI
    # run); at its threshold every connection idle for 2 s goes, until fewer than CROWDED_SHARE of the limit are open.
    crowded = [{"name": _MAX_CONNECTIONS, "threshold": {"value": CROWDED_SHARE}}]
    return {
        "refresh_interval": "0.25s",
        "resource_monitors": [
            {
                "name": _FIXED_HEAP,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                    "max_heap_size_bytes": max_heap_bytes,
                },
            },
            {
                "name": _MAX_CONNECTIONS,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3"
                    ".DownstreamConnectionsConfig",
                    "max_active_downstream_connections": max_connections,
                },
            },
        ],
        "actions": [
            {
                "name": "envoy.overload_actions.reduce_timeouts",
                "triggers": scaled + crowded,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.config.overload.v3.ScaleTimersOverloadActionConfig",
                    "timer_scale_factors": [
                        {"timer": timer, "min_timeout": "2s"}
                        for timer in ("HTTP_DOWNSTREAM_CONNECTION_IDLE", "HTTP_DOWNSTREAM_STREAM_IDLE")
                    ],
                },
            },
            {"name": "envoy.overload_actions.shrink_heap", "triggers": at(0.90)},
            {"name": "envoy.overload_actions.disable_http_keepalive", "triggers": at(0.90)},
            {"name": "envoy.overload_actions.stop_accepting_requests", "triggers": at(0.95)},
        ],
    }


def _local_replies() -> dict[str, Any]:
    """Envoy's own answers to HTTP callers (an unreachable gateway, a reset, a timeout, overload, a body over the
    limit, a body the transcoder cannot read) get the JSON error body, the first mapper that matches deciding its
    code and reason. Native gRPC callers keep Envoy's grpc-status; the request check's refusals and the routes' own
    404 and 405 keep the JSON bodies they have. The request check ends a body it will not read to its end (past the
    body budget, past the body limit) by setting `cut` and handing the transcoder a byte it cannot read: the first
    mappers turn the transcoder's 400 into that answer."""
    retry = [_header("retry-after", "1")]
    return {
        "mappers": [
            # Envoy's refusal of a new request near its heap limit, to a native gRPC caller: UNAVAILABLE, as Envoy
            # maps its 503, with the reason and retry delay the services give.
            _native_reply(
                _refused_overloaded(),
                Unavailable(
                    "Envoy is near its memory limit and takes no new requests for now; retry",
                    reason="OVERLOADED",
                    retry_after_s=1,
                ),
            ),
            _local_reply(_cut("OVERLOADED"), _UNAVAILABLE, *_BODIES_OVERLOADED, retry, status=503),
            _local_reply(_cut("BODY_TOO_LARGE"), _INVALID_ARGUMENT, *_BODY_TOO_LARGE, status=413),
            _local_reply(
                _cut("BODY_NOT_ALLOWED"),
                _INVALID_ARGUMENT,
                "BODY_NOT_ALLOWED",
                "this route takes no body (its fields travel in the path; docs/http.md): send it without one",
                status=400,
            ),
            _local_reply(
                _cut("CHUNKS_TOO_SMALL"),
                _INVALID_ARGUMENT,
                "CHUNKS_TOO_SMALL",
                f"the body comes in more than {FEW_CHUNKS} pieces of under {MIN_CHUNK_BYTES} bytes on average (each "
                "costs Envoy's request check a step): send it in larger writes",
                status=400,
            ),
            _local_reply(
                {"header_filter": {"header": {"name": ":path", "string_match": {"exact": READINESS_PATH}}}},
                _UNAVAILABLE,
                "NOT_READY",
                "the gateway is not serving (starting, draining or unreachable: Envoy's gRPC health check)",
                retry,
            ),
            _local_reply(
                _refused_overloaded(),
                _UNAVAILABLE,
                "OVERLOADED",
                "Envoy is near its memory limit and takes no new requests for now; retry",
                retry,
            ),
            _local_reply(
                _flags("UH", "UF", "UO", "URX", "UC", "UR", "LR", "NC"),
                _UNAVAILABLE,
                "UPSTREAM_UNAVAILABLE",
                "the gateway (or the config service) cannot be reached just now; retry",
                retry,
            ),
            _local_reply(_flags("UT"), _DEADLINE_EXCEEDED, "UPSTREAM_TIMEOUT", "the service did not answer in time"),
            # What no route takes at all (a CONNECT: the routes match paths, and it has none) would be an empty 404.
            _local_reply(_flags("NR"), _NOT_FOUND, *_ROUTE_NOT_FOUND),
            # A target that is not a path (`OPTIONS *`): Envoy's connection manager answers 404 before any route.
            _local_reply({"and_filter": {"filters": [_status(404), _not_a_path()]}}, _NOT_FOUND, *_ROUTE_NOT_FOUND),
            _local_reply(
                _flags("SI"),
                _DEADLINE_EXCEEDED,
                "STREAM_IDLE_TIMEOUT",
                f"nothing was sent or received for {STREAM_IDLE_TIMEOUT}",
            ),
            _local_reply(
                _status(408),
                _DEADLINE_EXCEEDED,
                "REQUEST_TIMEOUT",
                f"the request's headers must arrive within {REQUEST_HEADERS_TIMEOUT} and all of it within "
                f"{REQUEST_TIMEOUT} of its first byte",
            ),
            _local_reply(_status(413), _INVALID_ARGUMENT, *_BODY_TOO_LARGE),
            _local_reply(_status(431), _INVALID_ARGUMENT, *_HEADERS_TOO_LARGE),
            # The transcoder's refusals (a value that does not fit its field: "dims": "many") and the HTTP codec's.
            _local_reply(
                {
                    "or_filter": {
                        "filters": [_status_between(400, 403), _status_between(406, 499)],
                    }
                },
                _INVALID_ARGUMENT,
                "INVALID_REQUEST",
                "the request cannot be read: %LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)",
            ),
            _local_reply(
                _status_between(500, 599),
                _INTERNAL,
                "EDGE_ERROR",
                "Envoy could not serve the request: %LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)",
            ),
        ],
    }


def _local_reply(
    condition: dict[str, Any],
    code: int,
    reason: str,
    message: str,
    headers: list[dict[str, Any]] | None = None,
    status: int | None = None,
) -> dict[str, Any]:
    """A local-reply mapper: for a reply to an HTTP caller that Envoy made itself and `condition` matches, the JSON
    error body (Envoy's own reason for it, its response code details, in the ErrorInfo metadata), with `status`
    instead of Envoy's when given."""
    # A key the request check sets (to true) is absent: the reply is neither the check's own nor to native gRPC; nor is
    # it to a native gRPC call the check never saw (Envoy refused it before its filters ran).
    not_own: list[dict[str, Any]] = [
        {
            "metadata_filter": {
                "matcher": {"filter": METADATA_NAMESPACE, "path": [{"key": key}], "value": {"bool_match": False}},
                "match_if_key_not_found": True,
            }
        }
        for key in ("answered", "native")
    ]
    not_own.append(
        {
            "or_filter": {
                "filters": [
                    {"header_filter": {"header": {"name": "content-type", "present_match": False}}},
                    {"header_filter": {"header": {**_GRPC_CONTENT_TYPE, "invert_match": True}}},
                    {"header_filter": {"header": {"name": TRANSCODED_HEADER, "present_match": True}}},
                ]
            }
        }
    )
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": ERROR_DOMAIN,
        "metadata": {"envoy": "%RESPONSE_CODE_DETAILS%"},
    }
    mapper: dict[str, Any] = {
        "filter": {"and_filter": {"filters": [condition, *not_own]}},
        "body_format_override": {"json_format": {"code": code, "message": message, "details": [info]}},
    }
    if headers:
        mapper["headers_to_add"] = headers
    if status is not None:
        mapper["status_code"] = status
    return mapper


def _native_reply(condition: dict[str, Any], error: SieError) -> dict[str, Any]:
    """A local-reply mapper: for a reply to a native gRPC call (gRPC's content type, not transcoded) that Envoy made
    itself and `condition` matches, `error`'s google.rpc.Status (its ErrorInfo, its RetryInfo) in
    grpc-status-details-bin, and its message; the status code is Envoy's mapping of its HTTP status."""
    details = _status_details(error)
    native = [
        {"header_filter": {"header": _GRPC_CONTENT_TYPE}},
        {"header_filter": {"header": {"name": TRANSCODED_HEADER, "present_match": False}}},
    ]
    return {
        "filter": {"and_filter": {"filters": [condition, *native]}},
        "headers_to_add": [_header("grpc-status-details-bin", details)],
        # Envoy sends a gRPC caller the body as grpc-message.
        "body_format_override": {"text_format": error.message},
    }


def _refused_overloaded() -> dict[str, Any]:
    """Envoy refused a new request near its heap limit (stop_accepting_requests): a 503 before any filter ran (its OM
    flag is set only after the reply is made)."""
    return {"or_filter": {"filters": [_flags("OM"), {"and_filter": {"filters": [_status(503), _unchecked()]}}]}}


def _status_details(error: SieError) -> str:
    """`error`'s google.rpc.Status as a grpc-status-details-bin header carries it."""
    return base64.b64encode(error.to_status().SerializeToString()).decode()


def _unchecked() -> dict[str, Any]:
    """The request check never saw the request: it sets `rpc` (never empty) or `answered` (only ever true) on every
    request it sees, so a key that is there never matches these values, and one that is not does."""
    values = {"rpc": {"string_match": {"exact": ""}}, "answered": {"bool_match": False}}
    return {
        "and_filter": {
            "filters": [
                {
                    "metadata_filter": {
                        "matcher": {"filter": METADATA_NAMESPACE, "path": [{"key": key}], "value": value},
                        "match_if_key_not_found": True,
                    }
                }
                for key, value in values.items()
            ]
        }
    }


def _not_a_path() -> dict[str, Any]:
    """The request's target is not a path (`OPTIONS *`)."""
    return {"header_filter": {"header": {"name": ":path", "string_match": {"prefix": "/"}, "invert_match": True}}}


def _cut(reason: str) -> dict[str, Any]:
    """The request check ended the request's body early with `reason` (request_check.lua's `cut`)."""
    matcher = {"filter": METADATA_NAMESPACE, "path": [{"key": "cut"}], "value": {"string_match": {"exact": reason}}}
    return {"metadata_filter": {"matcher": matcher, "match_if_key_not_found": False}}


def _flags(*flags: str) -> dict[str, Any]:
    return {"response_flag_filter": {"flags": list(flags)}}


def _status(status: int, op: str = "EQ") -> dict[str, Any]:
    value = {"default_value": status, "runtime_key": "sie.local_reply.status"}
    return {"status_code_filter": {"comparison": {"op": op, "value": value}}}


def _status_between(low: int, high: int) -> dict[str, Any]:
    return {"and_filter": {"filters": [_status(low, "GE"), _status(high, "LE")]}}


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
    return {
        "match": match,
        "direct_response": {"status": status, "body": {"inline_string": _error_json(code, reason, message, metadata)}},
        "response_headers_to_add": [_header("content-type", "application/json")],
    }


def _error_json(code: int, reason: str, message: str, metadata: dict[str, str] | None = None) -> str:
    """The JSON error body the transcoder gives gRPC errors: `code` with an ErrorInfo of `reason`."""
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": ERROR_DOMAIN,
        "metadata": metadata or {},
    }
    return json.dumps({"code": code, "message": message, "details": [info]})


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
    for _, _, verb, template, _ in _http_rules(files):
        methods = bindings.setdefault(_path_regex(template), [])
        if verb not in methods:
            methods.append(verb)
    return bindings


def _checked_routes(files: Sequence[descriptor_pb2.FileDescriptorProto]) -> list[CheckedRoute]:
    """Each rule as the request check reads it: method, template, the body's message and what its path binds."""
    messages = {f"{file.package}.{message.name}": message for file in files for message in file.message_type}
    routes: list[CheckedRoute] = []
    for rpc, method, verb, template, body in _http_rules(files):
        if not body:
            routes.append(CheckedRoute(verb, template, "", [], rpc))
            continue
        message = method.input_type.lstrip(".")
        in_path = template_fields(template)
        if body != "*":
            message = next(f for f in messages[message].field if f.name == body).type_name.lstrip(".")
            in_path = []
        routes.append(CheckedRoute(verb, template, message, in_path, rpc))
    return routes


def _http_rules(
    files: Sequence[descriptor_pb2.FileDescriptorProto],
) -> Iterator[tuple[str, descriptor_pb2.MethodDescriptorProto, str, str, str]]:
    """(gRPC path, RPC, HTTP method, path template, body) of every google.api.http rule of the transcoded services."""
    for file in files:
        for service in file.service:
            full_name = f"{file.package}.{service.name}"
            if full_name not in SERVICES:
                continue
            for method in service.method:
                for verb, template, body in _rules(method.options.Extensions[annotations_pb2.http]):
                    yield f"/{full_name}/{method.name}", method, verb, template, body


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


def _cluster(name: str, address: str, health_checked: bool = False, http2: bool = True) -> dict[str, Any]:
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
                "explicit_http_config": {"http2_protocol_options": _http2_windows()}
                if http2
                else {"http_protocol_options": {}},
            },
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(host, int(port))}}]}],
        },
    }


def _http2_windows() -> dict[str, int]:
    """HTTP/2 flow-control windows, which are also the buffer limits of an HTTP/2 stream's data (Envoy's defaults, 256
    MiB, let each of 64 native 16 MB calls queue its whole message in Envoy for a gateway that read two: 149 MiB of
    them pending at once, past the heap limit): downstream, what a client may send before Envoy has passed it on;
    upstream, what Envoy queues for a service that has not read it."""
    return {
        "initial_stream_window_size": STREAM_WINDOW_BYTES,
        "initial_connection_window_size": CONNECTION_BUFFER_BYTES,
    }


def _seconds(duration: str) -> int:
    """Whole seconds of a protobuf JSON duration ("60s")."""
    return int(duration.removesuffix("s"))


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}
