"""Rerank as Cohere and Jina define it: `POST /v1/rerank` (Cohere v1, and Jina, whose request is the same) and
`POST /v2/rerank` (Cohere v2), served by the contract's Score on any model that scores.

Request: `model`, `query`, `documents` (strings, or `{"text": ...}` objects), `top_n`, `return_documents`, and
`max_tokens_per_doc` (v2) when sent. Answer: `results` best first, each with `index` (the document's position),
`relevance_score` (Score's score, unchanged) and `document: {"text"}` when asked; with `id`, `meta`
(`api_version`, `billed_units`) and `model`, the fields Cohere's and Jina's clients read. Errors are Cohere's
`{"message": ...}` (with `id`), at the HTTP status of docs/http.md."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from sie.v1 import inference_pb2, types_pb2
from sie_gateway.http_adapter.errors import AdapterError, invalid
from sie_gateway.http_adapter.fields import Fields, wrong_type
from sie_gateway.http_adapter.translate import model_and_profile
from sie_gateway.http_adapter.wire import Adapter

PATHS = {"/v1/rerank": "1", "/v2/rerank": "2"}
UNSUPPORTED = {
    "rank_fields": "documents are ranked by their text only",
    "max_chunks_per_doc": "documents are not chunked: each is truncated at the model's max_sequence_length",
}


class Rerank:
    def claims(self, request: web.Request) -> bool:
        return request.path in PATHS

    async def serve(self, request: web.Request, adapter: Adapter) -> web.StreamResponse:
        if request.method != "POST":
            raise AdapterError(405, "METHOD_NOT_ALLOWED", "this path takes POST only")
        fields = Fields(await adapter.json(request), "", UNSUPPORTED)
        model, profile = model_and_profile(fields.text("model", required=True) or "")
        query = fields.text("query", required=True) or ""
        documents = _documents(fields.required("documents"), adapter.max_items)
        top_n = fields.whole("top_n")
        if top_n is not None and top_n < 1:
            raise invalid("top_n must be at least 1", field="top_n")
        return_documents = bool(fields.flag("return_documents"))
        max_tokens = fields.whole("max_tokens_per_doc")
        fields.done("model, query, documents, top_n, return_documents, max_tokens_per_doc")
        if max_tokens is not None:
            await _check_max_tokens(adapter, request, model, max_tokens)
        score = inference_pb2.ScoreRequest(
            model=model,
            query=types_pb2.Item(text=query),
            items=[types_pb2.Item(text=text) for text in documents],
            profile=profile,
        )
        if top_n is not None:
            score.top_k = top_n
        response = await adapter.calls.call("Score", score, request.headers)
        results = []
        for entry in response.scores:
            result: dict[str, Any] = {"index": entry.index, "relevance_score": entry.score}
            if return_documents:
                result["document"] = {"text": documents[entry.index]}
            results.append(result)
        return web.json_response(
            {
                "id": str(uuid.uuid4()),
                "results": results,
                "meta": {"api_version": {"version": PATHS[request.path]}, "billed_units": {"search_units": 1}},
                "model": model,
            }
        )

    def error_response(self, error: AdapterError) -> web.Response:
        body = {"id": str(uuid.uuid4()), "message": error.message, "reason": error.reason}
        return web.json_response(body, status=error.status, headers=error.retry_after_header)


def _documents(value: Any, max_items: int) -> list[str]:
    """The documents' texts: each a string or {"text": ...}."""
    if not isinstance(value, list):
        raise wrong_type("documents", "an array of strings or {text} objects", value)
    if not value:
        raise invalid("documents must not be empty", reason="NO_ITEMS", field="documents")
    if len(value) > max_items:
        raise invalid(
            f"documents has {len(value)} entries; the limit is {max_items} (SIE_MAX_ITEMS_PER_REQUEST)",
            reason="TOO_MANY_ITEMS",
            field="documents",
        )
    texts = []
    for index, document in enumerate(value):
        if isinstance(document, str):
            texts.append(document)
            continue
        fields = Fields(document, f"documents[{index}]")
        texts.append(fields.text("text", required=True) or "")
        fields.done("text")
    return texts


async def _check_max_tokens(adapter: Adapter, request: web.Request, model: str, max_tokens: int) -> None:
    """max_tokens_per_doc is honoured when it is at least the model's max_sequence_length (every document is
    truncated there); below it this engine cannot truncate, and says so."""
    if max_tokens < 1:
        raise invalid("max_tokens_per_doc must be at least 1", field="max_tokens_per_doc")
    described = await adapter.calls.call("GetModel", inference_pb2.GetModelRequest(model=model), request.headers)
    longest = described.model.max_sequence_length
    if longest and max_tokens < longest:
        raise AdapterError(
            400,
            "NOT_SUPPORTED",
            f"max_tokens_per_doc={max_tokens}: this engine truncates each document at {model}'s max_sequence_length "
            f"({longest} tokens) and cannot truncate shorter; leave it out or send at least {longest}",
            field="max_tokens_per_doc",
        )
