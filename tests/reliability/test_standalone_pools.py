"""Resource pools on a standalone worker (issue 32, defect 8): every pool RPC answers a clean UNIMPLEMENTED with a
reason that sends the caller to the gateway; before, ListPools logged an ERROR traceback on every call."""

from __future__ import annotations

import grpc
import pytest

from grpc_helpers import error_info
from sie.v1 import inference_pb2

CALLS = {
    "CreatePool": inference_pb2.CreatePoolRequest(name="p"),
    "GetPool": inference_pb2.GetPoolRequest(name="p"),
    "ListPools": inference_pb2.ListPoolsRequest(),
    "RenewPool": inference_pb2.RenewPoolRequest(name="p"),
    "DeletePool": inference_pb2.DeletePoolRequest(name="p"),
}


def test_pool_rpcs_on_a_standalone_worker_are_unimplemented_without_a_traceback(worker, stub) -> None:
    log_before = len(worker.log())
    for method, request in CALLS.items():
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as caught:
                getattr(stub, method)(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
            assert error_info(caught.value).reason == "POOLS_NOT_SERVED", method
            assert "send pool requests to the gateway" in caught.value.details()
    assert stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10).models  # still serving
    logged = worker.log()[log_before:]
    assert "Traceback" not in logged and " ERROR " not in logged, logged[-2000:]
