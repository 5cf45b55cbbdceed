"""A worker pointed at etcd serves a model the config service adds while it runs."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from local_cluster import wait_for_leader
from test_config_service import error_reason

ADDED = "test/added-at-runtime"


def test_worker_serves_a_model_added_through_the_config_service(
    start_config, start_worker, etcd_server, etcd_prefix: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    config = start_config()
    worker = start_worker(
        SIE_ETCD_ENDPOINTS=etcd_server.endpoint, SIE_ETCD_PREFIX=etcd_prefix, SIE_MODELS_DIR=str(tmp_path), SIE_PRELOAD_MODELS=""
    )
    try:
        with grpc.insecure_channel(config.address) as config_channel, grpc.insecure_channel(worker.address) as worker_channel:
            admin = config_pb2_grpc.ConfigServiceStub(config_channel)
            inference = inference_pb2_grpc.InferenceStub(worker_channel)
            wait_for_leader(admin)
            request = inference_pb2.EncodeRequest(model=ADDED, items=[types_pb2.Item(text="added while running")])
            with pytest.raises(grpc.RpcError) as before:
                inference.Encode(request)
            assert before.value.code() == grpc.StatusCode.NOT_FOUND
            assert error_reason(before.value)[0] == "MODEL_NOT_FOUND"

            added = admin.AddModel(config_pb2.AddModelRequest(config={
                "id": ADDED,
                "path": str(tiny_models["test/tiny-mean"]),
                "profiles": {"default": {"adapter": "sentence_transformer"}},
            }))
            assert added.created

            deadline = time.monotonic() + 60
            while True:
                try:
                    reply = inference.Encode(request, timeout=60)
                    break
                except grpc.RpcError as error:
                    # NOT_FOUND until the config arrives, then UNAVAILABLE (MODEL_LOADING) while it loads.
                    waiting = {grpc.StatusCode.NOT_FOUND: "MODEL_NOT_FOUND", grpc.StatusCode.UNAVAILABLE: "MODEL_LOADING"}
                    assert waiting.get(error.code()) == error_reason(error)[0] and time.monotonic() < deadline, error
                    time.sleep(0.2)
            vector = from_tensor(reply.results[0].dense)
            assert vector.shape == (32,)
            assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)  # tiny-mean normalizes
            assert ADDED in [model.id for model in inference.ListModels(inference_pb2.ListModelsRequest()).models]

            # The worker's bundle hash follows: it equals the one the config service reports now.
            bundle = admin.GetBundle(config_pb2.GetBundleRequest(bundle_id="default")).bundle
            assert f"bundle default config hash {bundle.config_hash}" in worker.log()
    finally:
        worker.stop()
