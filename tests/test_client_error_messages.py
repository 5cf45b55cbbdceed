"""Errors that say what to change: a score without a query names the query; a gRPC server that is not SIE gets a
message that says so, naming the method and the target; a timeout names the setting that ran out and its value.
Against real gRPC servers: a real worker, a server with only the health service, and an Inference server that never
answers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import foreign_servers
from client_observation import requests_answered
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_client import ServerError, SIEClient

MODEL = "test/tiny-mean"
RERANKER = "test/tiny-reranker"


def test_score_without_a_query_names_the_query(worker) -> None:
    before = requests_answered(worker, RERANKER, "score")
    with SIEClient(worker.address) as client:
        with pytest.raises(TypeError, match=r"^score's query is an Item, a str or a dict, not NoneType$"):
            client.score(RERANKER, None, ["a", "b"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^score's query is an Item, a str or a dict, not list$"):
            client.score(RERANKER, ["a", "b"], ["c"])  # type: ignore[arg-type]  (items given as the query)
        with pytest.raises(TypeError, match=r"^score's items\[1\] is an Item, a str or a dict, not int$"):
            client.score(RERANKER, "q", ["a", 3])  # type: ignore[list-item]
        with pytest.raises(TypeError, match=r"score's items are a list of items, not one str: wrap it in \[\.\.\.\]"):
            client.score(RERANKER, "q", "one document")
        with pytest.raises(TypeError, match=r"^an item is an Item, a str or a dict, not NoneType$"):
            client.encode(MODEL, [None])  # type: ignore[list-item]
    assert requests_answered(worker, RERANKER, "score") == before  # refused before sending


@pytest.fixture
def health_only_server() -> Iterator[str]:
    with foreign_servers.health_only_server() as target:
        yield target


def test_a_server_that_is_not_sie_is_named_as_such(health_only_server: str) -> None:
    with SIEClient(f"http://{health_only_server}") as client:
        for call, rpc in (
            (lambda: client.encode(MODEL, "hello"), "sie.v1.Inference/Encode"),
            (lambda: client.encode(MODEL, ["a"] * 300), "sie.v1.Inference/EncodeStream"),
            (lambda: client.score(RERANKER, "q", ["a"]), "sie.v1.Inference/Score"),
            (lambda: client.list_models(), "sie.v1.Inference/ListModels"),
        ):
            with pytest.raises(ServerError) as raised:
                call()
            message = str(raised.value)
            assert f"{health_only_server} does not serve {rpc}" in message, message
            assert "this does not look like an SIE server" in message and "base_url" in message, message
            assert "Method not found!" in message  # what grpc said, kept
            assert raised.value.grpc_code == grpc.StatusCode.UNIMPLEMENTED


class _Stalled(inference_pb2_grpc.InferenceServicer):
    """An Inference server that takes requests and does not answer until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def Encode(self, request, context):
        self.release.wait(60)
        return inference_pb2.EncodeResponse()

    def EncodeStream(self, request_iterator, context):
        self.release.wait(60)
        return iter(())


@pytest.fixture
def stalled_server() -> Iterator[str]:
    servicer = _Stalled()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    servicer.release.set()
    server.stop(grace=None)


def test_a_timeout_names_the_setting_and_its_value(stalled_server: str) -> None:
    with SIEClient(stalled_server, read_timeout_s=0.5) as client:
        with pytest.raises(ServerError) as raised:
            client.encode(MODEL, "hello")
        message = str(raised.value)
        assert raised.value.grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "sie.v1.Inference/Encode" in message and stalled_server in message, message
        assert "read_timeout_s=0.5" in message and "within 0.5 s" in message, message
        assert "raise read_timeout_s (or timeout_s) of the client" in message, message

        with pytest.raises(ServerError) as raised:  # the streamed path, whose deadline is per answer
            client.encode(MODEL, ["a"] * 300)
        message = str(raised.value)
        assert raised.value.grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "sie.v1.Inference/EncodeStream" in message and "read_timeout_s=0.5" in message, message
    with SIEClient(stalled_server, timeout_s=0.5) as client:  # timeout_s sets it too, and the message says which value
        with pytest.raises(ServerError, match=r"read_timeout_s=0\.5"):
            client.encode(MODEL, "hello")
