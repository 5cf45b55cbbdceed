"""`GET /v1/models` and `GET /v1/models/{model}` for every HTTP caller: this engine's own listing (ListModels and
DescribeModel as the transcoder wrote them: the protos' field names, every field) with OpenAI's keys added beside
them, so OpenAI's clients (`client.models.list()`, `client.models.retrieve(id)`) read the same answer:
`object: "list"` and `data: [{id, object: "model", created, owned_by}]` on the list, `object`, `created` and
`owned_by` on one model. `created` is 0 (a config has no creation time), `owned_by` the model id's organisation
(what precedes its first `/`; "sie" when it has none). Errors are the JSON error body of every other route."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from sie.v1 import inference_pb2
from sie_gateway.http_adapter.errors import AdapterError
from sie_gateway.http_adapter.translate import model_and_profile
from sie_gateway.http_adapter.wire import Adapter

LIST_PATH = "/v1/models"


class OpenAIModels:
    def claims(self, request: web.Request) -> bool:
        return request.path == LIST_PATH or request.path.startswith(LIST_PATH + "/")

    async def serve(self, request: web.Request, adapter: Adapter) -> web.StreamResponse:
        if request.method != "GET":
            raise AdapterError(405, "METHOD_NOT_ALLOWED", "this path takes GET only")
        if request.path == LIST_PATH:
            listed = await adapter.calls.call("ListModels", inference_pb2.ListModelsRequest(), request.headers)
            body = _as_json(listed)
            body["object"] = "list"
            body["data"] = [_openai(model.id) for model in listed.models]
            return web.json_response(body)
        name, _ = model_and_profile(request.path.removeprefix(LIST_PATH + "/"))  # "model@profile" names the model
        model = await adapter.calls.call(
            "DescribeModel", inference_pb2.DescribeModelRequest(model=name), request.headers
        )
        return web.json_response({**_as_json(model), **_openai(model.id)})

    def error_response(self, error: AdapterError) -> web.Response:
        return json_error(error)


def _as_json(message: Message) -> dict[str, Any]:
    """A message as Envoy's transcoder writes it (proto field names, fields at their defaults included)."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _openai(model_id: str) -> dict[str, Any]:
    owner, slash, _ = model_id.partition("/")
    return {"id": model_id, "object": "model", "created": 0, "owned_by": owner if slash else "sie"}


def json_error(error: AdapterError) -> web.Response:
    """The JSON error body the transcoder gives gRPC errors (docs/http.md, "Errors")."""
    metadata = dict(error.metadata)
    if error.field:
        metadata.setdefault("field", error.field)
    details: list[dict[str, Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": error.reason,
            "domain": "sie",
            "metadata": metadata,
        }
    ]
    return web.json_response(
        {"code": error.code.value[0], "message": error.message, "details": details},
        status=error.status,
        headers=error.retry_after_header,
    )
