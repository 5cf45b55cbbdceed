"""The reference SDK's pure helpers (encoding, scoring, types) on fixed inputs, as JSON: run with the reference's
venv (`python reference_sdk_cases.py sie_sdk`) and imported here for sie_client (`outcomes("sie_client")`), so
tests/test_client_reference_behaviour.py can compare both answers value for value, errors included."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np


def _run(call: Callable[[], Any]) -> Any:
    """The answer as JSON-able values, or the name of the exception raised."""
    try:
        answer = call()
    except Exception as error:  # noqa: BLE001 (which exception is what is compared)
        return {"raises": type(error).__name__}
    if isinstance(answer, np.ndarray):
        return {"array": np.round(answer.astype(np.float64), 5).tolist(), "dtype": str(answer.dtype)}
    if isinstance(answer, list) and answer and isinstance(answer[0], float):
        return [round(value, 5) for value in answer]
    if isinstance(answer, dict):
        return {str(key): value for key, value in answer.items()}
    return answer


def outcomes(package: str) -> dict[str, Any]:
    encoding = importlib.import_module(f"{package}.encoding")
    scoring = importlib.import_module(f"{package}.scoring")
    types = importlib.import_module(f"{package}.types")
    rng = np.random.default_rng(7)
    dense = rng.standard_normal(6).astype(np.float32)
    sparse = {"indices": np.array([3, 17, 40], dtype=np.int32), "values": np.array([0.5, 1.25, 2.0], np.float32)}
    query = rng.standard_normal((3, 4)).astype(np.float32)
    documents = [rng.standard_normal((n, 4)).astype(np.float32) for n in (2, 5)]
    half = [document.astype(np.float16) for document in documents]
    cases: dict[str, Callable[[], Any]] = {
        "dense_embedding": lambda: encoding.dense_embedding({"dense": dense}),
        "dense_embedding missing": lambda: encoding.dense_embedding({"sparse": sparse}),
        "dense_embedding missing, not strict": lambda: encoding.dense_embedding({}, strict=False),
        "dense_embedding of a list": lambda: encoding.dense_embedding({"dense": [1.0, 2.0]}),
        "sparse_embedding": lambda: encoding.sparse_embedding({"sparse": sparse}),
        "sparse_embedding missing": lambda: encoding.sparse_embedding({"dense": dense}),
        "sparse_embedding of lists": lambda: encoding.sparse_embedding({"sparse": {"indices": [1], "values": [0.5]}}),
        "sparse_embedding_dict": lambda: encoding.sparse_embedding_dict({"sparse": sparse}),
        "sparse_embedding_dict missing": lambda: encoding.sparse_embedding_dict({}),
        "sparse_embedding_dict no values": lambda: encoding.sparse_embedding_dict({"sparse": {"indices": [1]}}),
        "normalize_sparse_vector": lambda: encoding.normalize_sparse_vector(sparse),
        "normalize_sparse_vector half": lambda: encoding.normalize_sparse_vector({"indices": [1, 2]}),
        "multivector_embedding array": lambda: encoding.multivector_embedding(query),
        "multivector_embedding arrays": lambda: encoding.multivector_embedding(list(query)),
        "multivector_embedding lists": lambda: encoding.multivector_embedding([[1.0, 2.0], [3.0, 4.0]]),
        "maxsim list": lambda: scoring.maxsim(query, documents),
        "maxsim one": lambda: scoring.maxsim(query, documents[0]),
        "maxsim stack": lambda: scoring.maxsim(query, np.stack([documents[0], documents[0]])),
        "maxsim float16": lambda: scoring.maxsim(query.astype(np.float16), half),
        "maxsim no tokens": lambda: scoring.maxsim(query, [np.zeros((0, 4), np.float32)]),
        "maxsim dims": lambda: scoring.maxsim(query, [np.zeros((2, 5), np.float32)]),
        "maxsim flat query": lambda: scoring.maxsim(query[0], documents),
        "maxsim empty": lambda: scoring.maxsim(query, []),
        "maxsim_batch": lambda: scoring.maxsim_batch([query, query[:1]], documents),
        "maxsim_batch dims": lambda: scoring.maxsim_batch([query], [np.zeros((2, 5), np.float32)]),
        "Item": lambda: json.loads(json.dumps(types.Item(id="a", text="hello"))),
        "np_to_dtype": lambda: [
            types.np_to_dtype(np.zeros(1, dtype)) for dtype in ("float32", "float16", "int8", "uint8", "float64")
        ],
    }
    return {name: _run(call) for name, call in cases.items()}


if __name__ == "__main__":
    json.dump(outcomes(sys.argv[1]), sys.stdout, sort_keys=True)
