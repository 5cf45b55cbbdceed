"""A Chroma embedding function backed by the engine (the `chroma` extra of sie-client:
`pip install ./contract/python './clients/python[chroma]'`).

Chroma calls `__call__` for the documents it stores and `embed_query` for `query_texts`,
so documents are encoded as documents and queries with `is_query=True`. The function is
registered under the name "sie": a persisted collection rebuilds it from its config.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sie_client.extras import needs_extra
from sie_client.integrations._common import DENSE, client_for

with needs_extra("sie_client.integrations.chroma", "chroma", "chromadb"):
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings
    from chromadb.utils.embedding_functions import register_embedding_function


@register_embedding_function
class SIEEmbeddingFunction(EmbeddingFunction[Documents]):
    def __init__(self, target: str, model: str, *, dims: int | None = None, **client_options: Any) -> None:
        self.target = target
        self.model = model
        self.dims = dims
        self._client = client_for("SIEEmbeddingFunction", target, client_options)

    def __call__(self, input: Documents) -> Embeddings:
        return self._encode(input, is_query=False)

    def embed_query(self, input: Documents) -> Embeddings:
        return self._encode(input, is_query=True)

    def _encode(self, texts: Documents, *, is_query: bool) -> Embeddings:
        results = (
            self._client.encode(self.model, list(texts), is_query=is_query, dims=self.dims, output_types=DENSE)
            if texts
            else []
        )
        return [np.asarray(result["dense"], dtype=np.float32) for result in results]

    @staticmethod
    def name() -> str:
        return "sie"

    def default_space(self) -> str:  # type: ignore[override]
        return "cosine"

    def get_config(self) -> dict[str, Any]:
        """Target, model and dims only: credentials never go into a collection's stored config."""
        return {"target": self.target, "model": self.model, "dims": self.dims}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> SIEEmbeddingFunction:
        return SIEEmbeddingFunction(config["target"], config["model"], dims=config.get("dims"))

    def close(self) -> None:
        self._client.close()
