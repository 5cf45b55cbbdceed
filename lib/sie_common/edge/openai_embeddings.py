"""OpenAI's embeddings API on top of Encode: request and response translation.

`input` is a string or a list of strings; `encoding_format` is "float"
(default: lists of numbers) or "base64" (little-endian float32 bytes, as the
`openai` client asks for by default); `dimensions` truncates (Matryoshka).
`usage` counts the tokens the model really read (after truncation). `user`
is taken (at most MAX_USER_BYTES) and not used.
"""

from __future__ import annotations

import base64

from google.protobuf import struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_common.edge.errors import InvalidArgument
from sie_common.edge.request_bounds import check_dims, check_user
from sie_contract.tensors import decode_tensor

ENCODING_FORMATS = ("float", "base64")


def encode_request(request: inference_pb2.CreateEmbeddingsRequest) -> inference_pb2.EncodeRequest:
    """The EncodeRequest that answers an embeddings request (INVALID_ARGUMENT for what it cannot). `user` is not
    used, only bounded (check_user)."""
    check_user(request.user)
    if request.encoding_format not in ("", *ENCODING_FORMATS):
        raise InvalidArgument(
            f"encoding_format {request.encoding_format!r} is not one of {', '.join(ENCODING_FORMATS)}",
            reason="INVALID_ENCODING_FORMAT",
        )
    texts = _texts(request.input)
    if not texts:  # said here, in OpenAI's words: the contract's own refusal would speak of `items`
        raise InvalidArgument(
            "input is empty: give a string or a non-empty list of strings",
            reason="NO_ITEMS",
            metadata={"field": "input"},
        )
    # Dense, whatever the model's own default output is: OpenAI embeddings are vectors.
    encode = inference_pb2.EncodeRequest(
        model=request.model, items=[types_pb2.Item(text=text) for text in texts], output_types=["dense"]
    )
    if request.HasField("dimensions"):
        check_dims(request.dimensions, "dimensions")
        encode.dims = request.dimensions
    return encode


def value_bytes(request: inference_pb2.CreateEmbeddingsRequest) -> int:
    """Bytes one number of the answer takes in its message: a google.protobuf.Value in a list (two tags,
    a length, a double), or base64 text of a float32."""
    return 6 if request.encoding_format == "base64" else 11


def embeddings_response(
    request: inference_pb2.CreateEmbeddingsRequest, response: inference_pb2.EncodeResponse
) -> inference_pb2.CreateEmbeddingsResponse:
    as_base64 = request.encoding_format == "base64"
    data = []
    for index, result in enumerate(response.results):
        vector = decode_tensor(result.dense).astype("<f4")
        embedding = struct_pb2.Value()
        if as_base64:
            embedding.string_value = base64.b64encode(vector.tobytes()).decode()
        else:
            embedding.list_value.extend(vector.tolist())
        data.append(inference_pb2.Embedding(object="embedding", index=index, embedding=embedding))
    usage = inference_pb2.EmbeddingsUsage(prompt_tokens=response.tokens, total_tokens=response.tokens)
    return inference_pb2.CreateEmbeddingsResponse(object="list", data=data, model=response.model, usage=usage)


def _texts(value: struct_pb2.Value) -> list[str]:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return [value.string_value]
    if kind == "list_value" and all(item.WhichOneof("kind") == "string_value" for item in value.list_value.values):
        return [item.string_value for item in value.list_value.values]
    raise InvalidArgument(
        "input must be a string or a list of strings (token arrays are not supported)", reason="INVALID_INPUT"
    )
