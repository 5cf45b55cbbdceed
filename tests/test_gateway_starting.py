"""A gateway's gRPC server answers before its view of the cluster is read from etcd (its health says NOT_SERVING
until then). A call in that window found a model's config but not yet its bundles and was refused for good:
FAILED_PRECONDITION NO_BUNDLE_FOR_MODEL to 8 of 51 calls right after a gateway restart (test_faults'
test_gateway_restart); CreatePool answered BUNDLE_NOT_FOUND "bundles: none". Until the view is read, every call
that reads it (models and pools) is UNAVAILABLE GATEWAY_STARTING with a retry delay, which the client waits out;
after, the same call reads the view."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from grpc_helpers import error_details, items
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.cluster.etcd import Etcd
from sie_gateway.cluster_view import ClusterView
from sie_gateway.demand import DemandRecorder
from sie_gateway.dispatch import Dispatcher
from sie_gateway.inference_api import STARTING_RETRY_S, GatewayInference
from sie_gateway.pools import PoolManager
from sie_gateway.settings import GatewaySettings

# Starts processes (the session's etcd).
pytestmark = pytest.mark.process


@pytest.fixture
async def gateway(etcd: Etcd) -> AsyncIterator[tuple[ClusterView, inference_pb2_grpc.InferenceStub]]:
    """The gateway's servicer on a loopback port over a view of this test's etcd prefix, not yet read."""
    settings = GatewaySettings()
    demand = DemandRecorder(etcd)
    view = ClusterView(etcd)
    dispatcher = Dispatcher(window=4, demand=demand)
    api = GatewayInference(settings, view, dispatcher, PoolManager(etcd, view, settings), demand)
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(api, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield view, inference_pb2_grpc.InferenceStub(channel)
    finally:
        await view.stop()
        await server.stop(None)


async def test_calls_before_the_view_is_read_are_told_to_retry(gateway) -> None:
    view, stub = gateway
    calls = [
        stub.Encode(inference_pb2.EncodeRequest(model="m", items=items(["a"]))),
        stub.Score(inference_pb2.ScoreRequest(model="m", query=items(["q"])[0], items=items(["d"]))),
        stub.ListModels(inference_pb2.ListModelsRequest()),
        stub.GetModel(inference_pb2.GetModelRequest(model="m")),
        stub.CreatePool(inference_pb2.CreatePoolRequest(name="p", bundle="b", gpus={"cpu": 1})),
        stub.ListPools(inference_pb2.ListPoolsRequest()),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        info, retry = error_details(raised.value)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info is not None and info.reason == "GATEWAY_STARTING"
        assert retry is not None and retry.retry_delay.ToTimedelta().total_seconds() == STARTING_RETRY_S

    await view.start()
    assert (await stub.ListModels(inference_pb2.ListModelsRequest())).models == []
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Encode(inference_pb2.EncodeRequest(model="m", items=items(["a"])))
    assert error_details(raised.value)[0].reason == "MODEL_NOT_FOUND"
