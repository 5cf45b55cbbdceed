"""The reference SDK's own HTTP wire (sie-sdk 0.10.1), so code written for it runs against this engine unchanged.

A request is the reference's when it carries the SDK's `X-SIE-SDK-Version` header, or msgpack as its content type
or accepted answer (Envoy sends exactly those here). Encode, score and extract bodies are msgpack maps (JSON too),
numpy arrays in msgpack-numpy's encoding; the answers the same, in the format the caller accepts. Models, pools and
capacity (`GET /health`) are JSON, as the SDK reads them. Errors are `{"error": {"code", "message", "param"}}` with
the code also in `X-SIE-Error-Code`, and the statuses and `Retry-After` the SDK's retry loops act on: 503
PROVISIONING (scale from zero: the SDK 0.10.1 waits on it, where the reference's docs speak of 202), 503
MODEL_LOADING / LORA_LOADING, 503 QUEUE_FULL and RESOURCE_EXHAUSTED, 502 MODEL_LOAD_FAILED without a retry.
The reference's features this engine does not have (generate, chat, responses, jobs, files, batches, estimate,
recommend, the status WebSocket) answer 501 NOT_SUPPORTED, saying so."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import msgpack
import numpy as np
from aiohttp import web
from google.protobuf import json_format

from sie.v1 import inference_pb2
from sie_contract.tensors import from_tensor
from sie_gateway.http_adapter.bodies import JSON_TYPE, MSGPACK_TYPE
from sie_gateway.http_adapter.errors import AdapterError, invalid
from sie_gateway.http_adapter.fields import Fields, struct
from sie_gateway.http_adapter.json_answer import dumps
from sie_gateway.http_adapter.translate import item_message, items_of, model_and_profile, result_id, timing
from sie_gateway.http_adapter.wire import Adapter

SDK_VERSION_HEADER = "x-sie-sdk-version"
ERROR_CODE_HEADER = "X-SIE-Error-Code"
# Pools the reference SDK creates have no lease of their own: it renews every 60 s, so three renewals' worth.
REFERENCE_POOL_TTL_S = 180
# The reference's paths for what this engine does not do (generate, chat, ...), by their first segments.
UNSUPPORTED = {
    "/v1/generate": "text generation",
    "/v1/chat": "chat completions",
    "/v1/responses": "the Responses API",
    "/v1/jobs": "batch jobs",
    "/v1/files": "file storage",
    "/v1/batches": "OpenAI-style batches",
    "/v1/estimate": "cost estimates",
    "/v1/recommend": "model recommendations",
    "/ws": "the status WebSocket (watch)",
    "/internal": "the control plane's connections",
}
_STATES = {
    inference_pb2.MODEL_STATE_AVAILABLE: "available",
    inference_pb2.MODEL_STATE_LOADING: "loading",
    inference_pb2.MODEL_STATE_LOADED: "loaded",
    inference_pb2.MODEL_STATE_FAILED: "failed",
    inference_pb2.MODEL_STATE_UNLOADING: "unloading",
}
# Refusals the reference SDK retries on (503 with Retry-After), as it names them.
_BACKPRESSURE = {
    "QUEUE_FULL": "QUEUE_FULL",
    "GATEWAY_BUSY": "QUEUE_FULL",
    "OVERLOADED": "QUEUE_FULL",
    "DEVICE_OUT_OF_MEMORY": "RESOURCE_EXHAUSTED",
}

Route = Callable[[web.Request, Adapter, str], Awaitable[web.StreamResponse]]


def is_reference(request: web.Request) -> bool:
    """The reference SDK's request: its version header, or msgpack sent or accepted."""
    return (
        SDK_VERSION_HEADER in request.headers
        or request.content_type == MSGPACK_TYPE
        or MSGPACK_TYPE in request.headers.get("accept", "")
    )


class ReferenceWire:
    def claims(self, request: web.Request) -> bool:
        return is_reference(request)

    async def serve(self, request: web.Request, adapter: Adapter) -> web.StreamResponse:
        path, method = request.path, request.method
        for prefix, feature in UNSUPPORTED.items():
            if path == prefix or path.startswith(prefix + "/"):
                raise AdapterError(
                    501,
                    "NOT_SUPPORTED",
                    f"{feature} ({method} {path[:100]}) is not supported by this engine: it serves encode, score, "
                    "extract, models, pools and capacity (docs/migration.md)",
                )
        routes: dict[tuple[str, str], Route] = {
            ("POST", "/v1/encode/"): _encode,
            ("POST", "/v1/score/"): _score,
            ("POST", "/v1/extract/"): _extract,
            ("GET", "/v1/models/"): _get_model,
            ("GET", "/v1/pools/"): _get_pool,
            ("DELETE", "/v1/pools/"): _delete_pool,
        }
        exact: dict[tuple[str, str], Route] = {
            ("GET", "/v1/models"): _list_models,
            ("POST", "/v1/pools"): _create_pool,
            ("GET", "/health"): _health,
        }
        if (method, path) in exact:
            return await exact[(method, path)](request, adapter, "")
        if method == "POST" and path.startswith("/v1/pools/") and path.endswith("/renew"):
            return await _renew_pool(request, adapter, path.removeprefix("/v1/pools/").removesuffix("/renew"))
        for (verb, prefix), route in routes.items():
            if method == verb and path.startswith(prefix) and len(path) > len(prefix):
                return await route(request, adapter, path.removeprefix(prefix))
        if any(path.startswith(prefix) for _, prefix in routes) or any(path == known for _, known in exact):
            raise AdapterError(405, "METHOD_NOT_ALLOWED", f"{method} is not taken on {path[:100]}")
        raise AdapterError(404, "NOT_FOUND", f"no route {method} {path[:100]} (docs/http.md lists them)")

    def error_response(self, error: AdapterError) -> web.Response:
        status, code = error.status, error.reason
        headers = error.retry_after_header
        if code in _BACKPRESSURE:
            status, code = 503, _BACKPRESSURE[code]
        elif error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.retry_after_s is None:
            status = 400  # retrying cannot help (an answer too large, a quota): not a 429, which the SDK retries
        if code in ("MODEL_LOAD_FAILED", "MODEL_LOAD_BACKOFF"):
            status, code, headers = 502, "MODEL_LOAD_FAILED", {}
        body: dict[str, Any] = {"code": code, "message": error.message}
        if error.field:
            body["param"] = error.field
        if code == "MODEL_LOAD_FAILED":
            body["permanent"] = error.reason == "MODEL_LOAD_FAILED"
            body["attempts"] = int(error.metadata.get("attempts", "1") or 1)
        return web.json_response({"error": body}, status=status, headers={**headers, ERROR_CODE_HEADER: code})


async def _body(request: web.Request, adapter: Adapter) -> dict[str, Any]:
    """A msgpack body, or JSON when it says so."""
    if request.content_type == JSON_TYPE:
        body = await adapter.json(request)
        if not isinstance(body, dict):
            raise invalid("the body must be a JSON object")
        return body
    return await adapter.msgpack(request)


async def _answer(request: web.Request, body: dict[str, Any]) -> web.Response:
    """msgpack (numpy arrays in msgpack-numpy's encoding) when the caller accepts it, else JSON (arrays as lists);
    written on a thread, so a large answer does not hold the gateway's event loop."""
    if MSGPACK_TYPE in request.headers.get("accept", "") or (
        request.content_type == MSGPACK_TYPE and JSON_TYPE not in request.headers.get("accept", "")
    ):
        packed = await asyncio.to_thread(msgpack.packb, body, default=_numpy_map, use_bin_type=True)
        return web.Response(body=packed, content_type=MSGPACK_TYPE)
    return web.Response(body=await asyncio.to_thread(dumps, body), content_type=JSON_TYPE)


def _numpy_map(value: Any) -> dict[bytes, Any]:
    """A numpy array (or scalar) as msgpack-numpy writes it, which the reference SDK reads."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {
            b"nd": True,
            b"type": array.dtype.str,
            b"kind": b"",
            b"shape": list(array.shape),
            b"data": array.tobytes(),
        }
    if isinstance(value, np.generic):
        return {b"nd": False, b"type": value.dtype.str, b"data": value.tobytes()}
    raise TypeError(f"cannot pack {type(value).__name__}")


def _params(fields: Fields, message: Any, profile: str, unsupported: dict[str, str] | None = None) -> None:
    """The body's `params` into the request's params message, field by field as that message defines them (the
    reference SDK's options, `is_query` among them, travel in `params.options`); the profile of "model@profile"."""
    params = Fields(fields.get("params") or {}, "params", unsupported)
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if field.message_type is not None:  # options: a Struct
            options = struct(params.mapping(name), f"params.{name}")
            if options is not None:
                getattr(message, name).CopyFrom(options)
        elif field.is_repeated:
            getattr(message, name).extend(params.texts(name) or ())
        elif field.type == field.TYPE_BOOL:
            if (flag := params.flag(name)) is not None:
                setattr(message, name, flag)
        elif field.type == field.TYPE_STRING:
            if (text := params.text(name)) is not None:
                setattr(message, name, text)
        elif field.type == field.TYPE_FLOAT:
            if (number := params.number(name)) is not None:
                setattr(message, name, number)
        elif (whole := params.whole(name)) is not None:
            setattr(message, name, whole)
    if profile:
        if message.HasField("profile") and message.profile != profile:
            raise invalid(f"the model names profile {profile!r} and params.profile {message.profile!r}")
        message.profile = profile
    params.done(", ".join(field.name for field in message.DESCRIPTOR.fields))


async def _encode(request: web.Request, adapter: Adapter, name: str) -> web.StreamResponse:
    fields = Fields(await _body(request, adapter))
    model, profile = model_and_profile(name)
    message = inference_pb2.EncodeRequest(
        model=model, items=items_of(fields.required("items"), "items", adapter.max_items)
    )
    _params(fields, message.params, profile)
    fields.done("items, params")
    response = await adapter.calls.call("Encode", message, request.headers)
    items = []
    for index, result in enumerate(response.results):
        item: dict[str, Any] = {"id": result_id(result.id, index)}
        for output in ("dense", "multivector"):
            if result.HasField(output):
                tensor = getattr(result, output)
                item[output] = {"values": from_tensor(tensor)}
                if tensor.scale:
                    item[output]["scale"] = np.asarray(tensor.scale, dtype=np.float32)
                if tensor.offset:
                    item[output]["offset"] = np.asarray(tensor.offset, dtype=np.float32)
        if result.HasField("sparse"):
            item["sparse"] = {
                "indices": np.asarray(result.sparse.indices, dtype=np.int32),
                "values": np.asarray(result.sparse.values, dtype=np.float32),
            }
        items.append(item)
    return await _answer(request, {"model": response.model, "items": items, "timing": timing(response.timing)})


async def _score(request: web.Request, adapter: Adapter, name: str) -> web.StreamResponse:
    fields = Fields(await _body(request, adapter))
    model, profile = model_and_profile(name)
    query = fields.required("query")
    message = inference_pb2.ScoreRequest(
        model=model,
        query=item_message(query, "query"),
        items=items_of(fields.required("items"), "items", adapter.max_items),
    )
    # The reference sends instruction and options at the top; params (this engine's shape) holds them too.
    if (instruction := fields.text("instruction")) is not None:
        message.instruction = instruction
    if (options := struct(fields.mapping("options"), "options")) is not None:
        message.options.CopyFrom(options)
    _params(fields, message.params, profile)
    fields.done("query, items, instruction, options, params")
    response = await adapter.calls.call("Score", message, request.headers)
    body: dict[str, Any] = {
        "model": response.model,
        "scores": [
            {
                "item_id": result_id(entry.item_id, entry.index),
                "score": entry.score,
                "rank": entry.rank,
                "index": entry.index,
            }
            for entry in response.scores
        ],
        "timing": timing(response.timing),
        # The reference's usage block: the tokens the model read, and the images when there were any.
        "usage": {"input_tokens": response.tokens, **({"images": response.images} if response.images else {})},
    }
    if isinstance(query, dict) and isinstance(query.get("id"), str) and query["id"]:
        body["query_id"] = query["id"]
    return await _answer(request, body)


async def _extract(request: web.Request, adapter: Adapter, name: str) -> web.StreamResponse:
    fields = Fields(await _body(request, adapter))
    model, profile = model_and_profile(name)
    message = inference_pb2.ExtractRequest(
        model=model, items=items_of(fields.required("items"), "items", adapter.max_items)
    )
    _params(
        fields,
        message.params,
        profile,
        {
            "output_schema": "structured extraction to a JSON schema is not supported by this engine",
            "instruction": "this engine's extractors take labels, not an instruction",
        },
    )
    fields.done("items, params")
    response = await adapter.calls.call("Extract", message, request.headers)
    items = [_extracted(result, index) for index, result in enumerate(response.results)]
    return await _answer(request, {"model": response.model, "items": items, "timing": timing(response.timing)})


def _entity(entity: inference_pb2.Entity) -> dict[str, Any]:
    return {"text": entity.text, "label": entity.label, "score": entity.score, "start": entity.start, "end": entity.end}


def _extracted(result: inference_pb2.ExtractResult, index: int) -> dict[str, Any]:
    """One item's findings with the reference's keys: relations by `relation` (the spans' texts as head and tail,
    the spans themselves as head_entity / tail_entity), object boxes as `bbox` [x, y, width, height] in whole pixels
    (the exact corners as `box`)."""
    objects = []
    for found in result.objects:
        box = found.box
        left, top = round(box.x_min), round(box.y_min)
        objects.append(
            {
                "label": found.label,
                "score": found.score,
                "bbox": [left, top, round(box.x_max) - left, round(box.y_max) - top],
                "box": {"x_min": box.x_min, "y_min": box.y_min, "x_max": box.x_max, "y_max": box.y_max},
            }
        )
    return {
        "id": result_id(result.id, index),
        "entities": [_entity(entity) for entity in result.entities],
        "relations": [
            {
                "head": found.head.text,
                "tail": found.tail.text,
                "relation": found.label,
                "score": found.score,
                "head_entity": _entity(found.head),
                "tail_entity": _entity(found.tail),
            }
            for found in result.relations
        ],
        "classifications": [{"label": found.label, "score": found.score} for found in result.classifications],
        "objects": objects,
        "data": json_format.MessageToDict(result.data) if result.HasField("data") else {},
    }


def model_info(model: inference_pb2.Model) -> dict[str, Any]:
    """A model as the reference lists it (state "loaded", profiles by name, last_error, dims of the outputs whose width
    is known), then the contract's own fields under their names where the reference has no such key."""
    failure = model.failure if model.HasField("failure") else None
    info: dict[str, Any] = {
        "name": model.id,
        "loaded": model.state == inference_pb2.MODEL_STATE_LOADED or bool(model.loaded_on),
        "state": _STATES.get(model.state, "available"),
        "last_error": None
        if failure is None
        else {
            "code": "UNKNOWN",
            "message": failure.error,
            "attempts": failure.attempts,
            "permanent": failure.permanent,
        },
        "inputs": list(model.inputs),
        "outputs": list(model.output_types),
        "dims": {"dense": model.dims} if model.dims and "dense" in model.output_types else {},
        "max_sequence_length": model.max_sequence_length or None,
        "revision": None,
        "profiles": {name: {"is_default": name == "default"} for name in model.profiles},
        "capabilities": None,
        "routing": {"policy": None, "upstream_kind": None},
        "aliases": [],
    }
    own = json_format.MessageToDict(model, preserving_proto_field_name=True)
    return {**info, **{key: value for key, value in own.items() if key not in info}}


async def _list_models(request: web.Request, adapter: Adapter, _: str) -> web.StreamResponse:
    response = await adapter.calls.call("ListModels", inference_pb2.ListModelsRequest(), request.headers)
    return web.json_response({"models": [model_info(model) for model in response.models]})


async def _get_model(request: web.Request, adapter: Adapter, name: str) -> web.StreamResponse:
    model, _ = model_and_profile(name)
    response = await adapter.calls.call("GetModel", inference_pb2.GetModelRequest(model=model), request.headers)
    return web.json_response(model_info(response.model))


def pool_info(pool: inference_pb2.Pool) -> dict[str, Any]:
    """A pool in the reference's nested shape (name, spec, status), with the contract's fields at the top too."""
    workers = list(pool.workers)
    return {
        **json_format.MessageToDict(pool, preserving_proto_field_name=True),
        "name": pool.name,
        "spec": {"name": pool.name, "gpus": dict(pool.gpus), "bundle": pool.bundle or None},
        "status": {
            "state": "active" if pool.ready else "pending",
            "assigned_workers": [{"name": worker, "url": "", "gpu": "", "bundle": pool.bundle} for worker in workers],
        },
        "workers": workers,
    }


async def _create_pool(request: web.Request, adapter: Adapter, _: str) -> web.StreamResponse:
    why = "this engine's pools reserve `gpus` workers of an optional `bundle`"
    fields = Fields(
        await adapter.json(request),
        "",
        {name: f"{name}: {why}" for name in ("gpu_caps", "minimum_worker_count", "pinned_models")},
    )
    queue_pool = fields.text("queue_pool")
    if queue_pool not in (None, "default"):
        raise AdapterError(400, "NOT_SUPPORTED", f"queue_pool: {why}", field="queue_pool")
    gpus = fields.mapping("gpus") or {}
    if not all(
        isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 2**32 for count in gpus.values()
    ):
        raise invalid("gpus must map machine profiles to whole numbers of workers", field="gpus")
    message = inference_pb2.CreatePoolRequest(
        name=fields.text("name", required=True) or "",
        gpus=gpus,
        ttl_s=REFERENCE_POOL_TTL_S,
        bundle=fields.text("bundle") or "",
    )
    fields.done("name, gpus, bundle, queue_pool")
    response = await adapter.calls.call("CreatePool", message, request.headers)
    return web.json_response(pool_info(response.pool))


async def _get_pool(request: web.Request, adapter: Adapter, name: str) -> web.StreamResponse:
    response = await adapter.calls.call("GetPool", inference_pb2.GetPoolRequest(name=name), request.headers)
    return web.json_response(pool_info(response.pool))


async def _renew_pool(request: web.Request, adapter: Adapter, name: str) -> web.StreamResponse:
    response = await adapter.calls.call("RenewPool", inference_pb2.RenewPoolRequest(name=name), request.headers)
    return web.json_response(pool_info(response.pool))


async def _delete_pool(request: web.Request, adapter: Adapter, name: str) -> web.StreamResponse:
    await adapter.calls.call("DeletePool", inference_pb2.DeletePoolRequest(name=name), request.headers)
    return web.json_response({"name": name, "deleted": True})


async def _health(request: web.Request, adapter: Adapter, _: str) -> web.StreamResponse:
    """Capacity as the reference gateway's /health says it: the workers the cluster reports (those that serve or
    have loaded a model; the contract names no idle ones and no machine profiles), each with its loaded models."""
    models = (await adapter.calls.call("ListModels", inference_pb2.ListModelsRequest(), request.headers)).models
    bundles = {
        worker: rollout.bundle
        for model in models
        for rollout in model.rollouts
        for worker in (*rollout.current_workers, *rollout.lagging_workers)
    }
    names = sorted({worker for model in models for worker in model.loaded_on} | set(bundles))
    workers = [
        {
            "name": name,
            "url": "",
            "gpu": "",
            "gpu_count": 1,
            "ready_gpu_slots": 1,
            "healthy": True,
            "queue_depth": 0,
            "pending_cost": 0,
            "inflight_batches": 0,
            "loaded_models": [model.id for model in models if name in model.loaded_on],
            "memory_used_bytes": 0,
            "memory_total_bytes": 0,
            "bundle": bundles.get(name, ""),
            "bundle_config_hash": "",
        }
        for name in names
    ]
    return web.json_response(
        {
            "type": "gateway",
            "status": "healthy" if workers else "no_workers",
            "cluster": {
                "worker_count": len(workers),
                "gpu_count": len(workers),
                "models_loaded": sum(1 for model in models if model_info(model)["loaded"]),
            },
            "workers": workers,
            "configured_gpu_types": [],
            "live_gpu_types": [],
        }
    )
