"""EncodeStream: many requests in flight on one stream, each answer tagged with its request id."""

from __future__ import annotations

import grpc
import numpy as np
from google.rpc import error_details_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_contract.tensors import from_tensor

MODEL = "test/tiny-cls"


def request(request_id: str, texts: list[str], model: str = MODEL) -> inference_pb2.EncodeStreamRequest:
    return inference_pb2.EncodeStreamRequest(
        request=inference_pb2.EncodeRequest(
            request_id=request_id, model=model, items=[types_pb2.Item(text=text) for text in texts]
        )
    )


def test_many_requests_in_flight_each_answered_by_id(stub) -> None:
    texts = {f"r{n}": [f"stream request {n} item {i}" for i in range(1 + n % 4)] for n in range(40)}
    expected = {
        request_id: np.stack([from_tensor(r.dense) for r in stub.Encode(request(request_id, batch).request).results])
        for request_id, batch in texts.items()
    }
    answers = list(stub.EncodeStream(iter([request(request_id, batch) for request_id, batch in texts.items()]), timeout=120))

    assert sorted(answer.request_id for answer in answers) == sorted(texts)
    for answer in answers:
        assert answer.WhichOneof("outcome") == "response"
        assert answer.response.request_id == answer.request_id
        vectors = np.stack([from_tensor(result.dense) for result in answer.response.results])
        np.testing.assert_allclose(vectors, expected[answer.request_id], atol=1e-5)


def test_a_bad_request_fails_alone_and_the_stream_goes_on(stub) -> None:
    answers = {
        answer.request_id: answer
        for answer in stub.EncodeStream(
            iter([request("good-1", ["fine"]), request("bad", ["x"], model="no/such-model"), request("good-2", ["also fine"])]),
            timeout=60,
        )
    }
    assert set(answers) == {"good-1", "bad", "good-2"}
    assert answers["good-1"].WhichOneof("outcome") == "response"
    assert answers["good-2"].WhichOneof("outcome") == "response"
    error = answers["bad"].error
    assert error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "no/such-model" in error.message
    info = error_details_pb2.ErrorInfo()
    assert error.details[0].Unpack(info)
    assert info.reason == "MODEL_NOT_FOUND"


def test_requests_without_an_id_are_tagged_by_position(stub) -> None:
    answers = list(stub.EncodeStream(iter([request("", ["one"]), request("", ["two"])]), timeout=60))
    assert sorted(answer.request_id for answer in answers) == ["0", "1"]


def test_openai_embeddings_on_a_standalone_worker(stub) -> None:
    import base64

    from google.protobuf import struct_pb2

    texts = struct_pb2.Value()
    texts.list_value.extend(["first text", "second text"])
    answer = stub.CreateEmbeddings(inference_pb2.CreateEmbeddingsRequest(model=MODEL, input=texts, encoding_format="base64"))
    encoded = stub.Encode(request("ref", ["first text", "second text"]).request)
    for item, result in zip(answer.data, encoded.results):
        vector = np.frombuffer(base64.b64decode(item.embedding.string_value), dtype="<f4")
        np.testing.assert_allclose(vector, from_tensor(result.dense), atol=1e-6)
    assert answer.usage.prompt_tokens == encoded.tokens > 0
