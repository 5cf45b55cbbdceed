"""A `sie up` for the HTTP adapter's tests: the demo model (all-MiniLM-L6-v2) and tiny models of the other outputs
and operations (sparse, multivector, a reranker, an entity extractor), added through its config service."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from local_cluster import model_config, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from sie_up_process import SieUp

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPLADE = "test/tiny-splade"
COLBERT = "test/tiny-colbert"
RERANKER = "test/tiny-reranker"
NER = "test/tiny-ner"
ADMIN_TOKEN = "adapter-admin"


def configs(tiny_models: dict[str, Path]) -> list[dict]:
    return [
        model_config(SPLADE, tiny_models[SPLADE], adapter="splade", output_types=["sparse"]),
        model_config(
            COLBERT, tiny_models[COLBERT], adapter="colbert", tasks=["encode", "score"], output_types=["multivector"]
        ),
        model_config(RERANKER, tiny_models[RERANKER], adapter="cross_encoder", tasks=["score"]),
        model_config(NER, tiny_models[NER], adapter="token_classifier", tasks=["extract"]),
    ]


@contextlib.contextmanager
def adapter_stack(directory: Path, tiny_models: dict[str, Path], **env: str) -> Iterator[SieUp]:
    """`sie up` (one worker, `env` added) with the models above, once the gateway knows them all."""
    stack = SieUp.start(directory, env={"SIE_ADMIN_TOKEN": ADMIN_TOKEN, **env})
    try:
        stack.wait_up()
        credentials = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
        wanted = configs(tiny_models)
        with grpc.insecure_channel(f"127.0.0.1:{stack.ports['config']}") as channel:
            admin = config_pb2_grpc.ConfigServiceStub(channel)
            for config in wanted:
                admin.AddModel(config_pb2.AddModelRequest(config=config), metadata=credentials, timeout=30)
        token = env.get("SIE_AUTH_TOKENS", "").split(",")[0]
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        with grpc.insecure_channel(stack.gateway) as channel:
            gateway = inference_pb2_grpc.InferenceStub(channel)
            ids = {config["id"] for config in wanted}

            def knows_them() -> bool:
                listed = gateway.ListModels(inference_pb2.ListModelsRequest(), timeout=5, metadata=metadata).models
                return ids <= {model.id for model in listed}

            wait_until(knows_them, timeout_s=60, what="the gateway knows the test models")
            for request, call in warm_ups(gateway):
                wait_until(
                    lambda call=call, request=request: _answers(call, request, metadata),
                    timeout_s=180,
                    what="the test models loaded",
                )
        yield stack
    finally:
        stack.stop()


def warm_ups(gateway: inference_pb2_grpc.InferenceStub) -> list[tuple[object, object]]:
    """A request per test model, which loads it (a first request answers UNAVAILABLE/MODEL_LOADING meanwhile)."""
    item = types_pb2.Item(text="warm up")
    return [
        (inference_pb2.EncodeRequest(model=SPLADE, items=[item], output_types=["sparse"]), gateway.Encode),
        (inference_pb2.EncodeRequest(model=COLBERT, items=[item], output_types=["multivector"]), gateway.Encode),
        (inference_pb2.ScoreRequest(model=RERANKER, query=item, items=[item]), gateway.Score),
        (inference_pb2.ExtractRequest(model=NER, items=[item]), gateway.Extract),
    ]


def _answers(call: Any, request: object, metadata: tuple[tuple[str, str], ...]) -> bool:
    try:
        call(request, timeout=30, metadata=metadata)
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            return False
        raise
    return True
