"""Hugging Face text-embeddings-inference's HTTP API, per model, under `/tei/{model}`: so one stack serves many
models to TEI's clients (huggingface_hub's InferenceClient, LangChain's HuggingFaceEndpointEmbeddings, LlamaIndex's
TextEmbeddingsInference, Haystack's TEI embedders), each pointed at `http://host:8080/tei/{model}`.

- `POST /embed` (and `POST /`, for a model that encodes): `inputs` (a string or strings), `normalize` (default
  true: L2-normalised here; false gives the model's own output), `truncate`, `truncation_direction` ("Right";
  inputs are always truncated at the model's max_sequence_length), `prompt_name` ("query" encodes queries,
  "document" / "passage" documents) -> `[[float, ...], ...]`, Encode's dense vectors.
- `POST /embed_sparse` -> `[[{"index", "value"}, ...], ...]`, Encode's sparse vectors.
- `POST /embed_all` -> `[[[float, ...], ...], ...]`, Encode's multivectors (one vector per token).
- `POST /rerank` (and `POST /`, for a model that only scores): `query`, `texts`, `raw_scores` (false: the
  sigmoid of Score's score, as TEI gives a reranker's; true: Score's score), `return_text`, `truncate`,
  `truncation_direction` -> `[{"index", "score", "text"?}, ...]` best first.
- `GET /info` (the model's id, type, max_input_length, max_client_batch_size), `GET /health` (200 once the model
  is known, 503 while the gateway cannot serve).
- `/predict`, `/tokenize`, `/decode` need a sequence classifier's labels or the tokenizer, which the contract does
  not expose: 424 with error_type "Backend", saying so.

Errors are TEI's `{"error": ..., "error_type": ...}`: "Validation" for a request the engine refuses (400, or 413
past a size bound), "Overloaded" (429), "Unhealthy" (503), "Backend" (424 and other failures)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
from aiohttp import web

from sie.v1 import inference_pb2, types_pb2
from sie_contract.tensors import from_tensor
from sie_gateway.http_adapter.errors import AdapterError, invalid
from sie_gateway.http_adapter.fields import Fields, wrong_type
from sie_gateway.http_adapter.json_answer import json_array
from sie_gateway.http_adapter.translate import model_and_profile
from sie_gateway.http_adapter.wire import Adapter

PREFIX = "/tei/"
ROUTES = {"embed", "embed_sparse", "embed_all", "rerank", "predict", "tokenize", "decode", "info", "health"}
NOT_SUPPORTED = {
    "predict": "sequence classification with the model's own labels is not exposed by this engine's contract",
    "tokenize": "the model's tokenizer is not exposed by this engine's contract",
    "decode": "the model's tokenizer is not exposed by this engine's contract",
}
# prompt_name -> is_query
PROMPTS = {"query": True, "document": False, "passage": False, "doc": False}
VERSION = "sie"


class Tei:
    def claims(self, request: web.Request) -> bool:
        return request.path.startswith(PREFIX)

    async def serve(self, request: web.Request, adapter: Adapter) -> web.StreamResponse:
        rest = request.path.removeprefix(PREFIX)
        name, _, route = rest.rpartition("/")
        if route not in ROUTES:
            name, route = rest, ""
        if not name:
            raise AdapterError(404, "ROUTE_NOT_FOUND", "TEI's routes are under /tei/{model}/ (docs/http.md)")
        model, profile = model_and_profile(name)
        method = "GET" if route in ("info", "health") else "POST"
        if request.method != method:
            raise AdapterError(405, "METHOD_NOT_ALLOWED", f"this path takes {method} only")
        if route in NOT_SUPPORTED:
            raise AdapterError(424, "NOT_SUPPORTED", f"/{route}: {NOT_SUPPORTED[route]}")
        if route == "health":
            await _describe(adapter, request, model)
            return web.Response(status=200)
        if route == "info":
            return web.json_response(_info(await _describe(adapter, request, model), adapter))
        if route == "":
            route = "embed" if "encode" in (await _describe(adapter, request, model)).tasks else "rerank"
        body = Fields(await adapter.json(request))
        if route == "rerank":
            return web.json_response(await _rerank(adapter, request, body, model, profile))
        return await json_array(request, await _embed(adapter, request, body, model, profile, route))

    def error_response(self, error: AdapterError) -> web.Response:
        status = error.status
        if status == 429 or error.reason in ("QUEUE_FULL", "GATEWAY_BUSY", "OVERLOADED"):
            status, kind = 429, "Overloaded"
        elif status == 503:
            kind = "Unhealthy"
        elif status >= 500 or status == 424:
            kind = "Backend"
        else:
            kind = "Validation"
        if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == "RESPONSE_TOO_LARGE":
            status = 413
        return web.json_response(
            {"error": error.message, "error_type": kind}, status=status, headers=error.retry_after_header
        )


async def _describe(adapter: Adapter, request: web.Request, model: str) -> inference_pb2.Model:
    response = await adapter.calls.call("GetModel", inference_pb2.GetModelRequest(model=model), request.headers)
    return response.model


def _info(model: inference_pb2.Model, adapter: Adapter) -> dict[str, Any]:
    kind: dict[str, Any] = (
        {"embedding": {"pooling": "unknown"}}
        if "encode" in model.tasks
        else {"reranker": {"id2label": {}, "label2id": {}}}
    )
    return {
        "model_id": model.id,
        "model_sha": None,
        "model_dtype": "float32",
        "model_type": kind,
        "max_concurrent_requests": 0,
        "max_input_length": model.max_sequence_length,
        "max_batch_tokens": 0,
        "max_batch_requests": None,
        "max_client_batch_size": adapter.max_items,
        "auto_truncate": True,
        "tokenization_workers": 0,
        "version": VERSION,
        "sha": None,
        "docker_label": None,
    }


def _inputs(fields: Fields, name: str, max_items: int) -> list[str]:
    """A string or an array of strings (at most SIE_MAX_ITEMS_PER_REQUEST)."""
    value = fields.required(name)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise wrong_type(name, "a string or an array of strings", value)
    if not texts:
        raise invalid(f"{name} must not be empty", reason="NO_ITEMS", field=name)
    if len(texts) > max_items:
        raise AdapterError(
            413,
            "TOO_MANY_ITEMS",
            f"{name} has {len(texts)} entries; the limit is {max_items} (SIE_MAX_ITEMS_PER_REQUEST)",
            field=name,
        )
    return texts


def _truncation(fields: Fields) -> None:
    """`truncate` and `truncation_direction`: inputs are always cut at the model's max_sequence_length, keeping
    their start, so "Right" (or nothing) is what happens; "Left" cannot be done."""
    fields.flag("truncate")
    direction = fields.text("truncation_direction")
    if direction is not None and direction.lower() != "right":
        raise invalid(
            f"truncation_direction {direction[:32]!r}: this engine keeps an input's start (Right) only",
            reason="NOT_SUPPORTED",
            field="truncation_direction",
        )


async def _embed(
    adapter: Adapter, request: web.Request, fields: Fields, model: str, profile: str, route: str
) -> Iterator[Any]:
    """Encode's answer, one element per input, made as the answer is written (json_array)."""
    texts = _inputs(fields, "inputs", adapter.max_items)
    normalize = fields.flag("normalize") if route == "embed" else None
    _truncation(fields)
    prompt = fields.text("prompt_name")
    if prompt is not None and prompt not in PROMPTS:
        raise invalid(
            f"prompt_name {prompt[:64]!r}: this engine knows {', '.join(PROMPTS)} (query or document templates)",
            field="prompt_name",
        )
    fields.done(
        "inputs, normalize, truncate, truncation_direction, prompt_name"
        if route == "embed"
        else "inputs, truncate, truncation_direction, prompt_name"
    )
    output = {"embed": "dense", "embed_sparse": "sparse", "embed_all": "multivector"}[route]
    encode = inference_pb2.EncodeRequest(
        model=model,
        items=[types_pb2.Item(text=text) for text in texts],
        output_types=[output],
        is_query=PROMPTS.get(prompt or "", False),
        profile=profile,
    )
    response = await adapter.calls.call("Encode", encode, request.headers)
    return (_element(result, output, normalize is not False) for result in response.results)


def _element(result: inference_pb2.EncodeResult, output: str, normalize: bool) -> Any:
    if output == "sparse":
        return [
            {"index": index, "value": value}
            for index, value in zip(result.sparse.indices, result.sparse.values, strict=True)
        ]
    array = from_tensor(getattr(result, output)).astype(np.float32)
    if output == "dense" and normalize:
        array = array / np.float32(max(float(np.linalg.norm(array)), 1e-12))
    return array


async def _rerank(adapter: Adapter, request: web.Request, fields: Fields, model: str, profile: str) -> list[Any]:
    query = fields.text("query", required=True) or ""
    texts = _inputs(fields, "texts", adapter.max_items)
    raw_scores = bool(fields.flag("raw_scores"))
    return_text = bool(fields.flag("return_text"))
    _truncation(fields)
    fields.done("query, texts, raw_scores, return_text, truncate, truncation_direction")
    score = inference_pb2.ScoreRequest(
        model=model,
        query=types_pb2.Item(text=query),
        items=[types_pb2.Item(text=text) for text in texts],
        profile=profile,
    )
    response = await adapter.calls.call("Score", score, request.headers)
    ranked = []
    for entry in response.scores:
        value = entry.score if raw_scores else float(1 / (1 + np.exp(-entry.score)))
        rank: dict[str, Any] = {"index": entry.index, "score": value}
        if return_text:
            rank["text"] = texts[entry.index]
        ranked.append(rank)
    return ranked
