"""A LanceDB embedding function backed by the engine (the `lancedb` extra of sie-client:
`pip install ./contract/python './clients/python[lancedb]'`).

Registered as "sie" in LanceDB's embedding-function registry:

    func = get_registry().get("sie").create(target="localhost:8080", model="sentence-transformers/all-MiniLM-L6-v2")

Source rows are encoded as documents, search strings with `is_query=True`. `api_key` is a
sensitive key: LanceDB only accepts it as a registry variable (`"$var:name"`), so it is never
stored in a table's schema metadata.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sie_client.extras import needs_extra
from sie_client.integrations._common import DENSE
from sie_client.sync_client import SIEClient

with needs_extra("sie_client.integrations.lancedb", "lancedb", "lancedb"):
    from lancedb.embeddings import TextEmbeddingFunction, register
    from pydantic import PrivateAttr


@register("sie")
class SIEEmbeddingFunction(TextEmbeddingFunction):
    target: str
    model: str
    dims: int | None = None
    api_key: str | None = None
    _client: SIEClient | None = PrivateAttr(default=None)
    _dims: int | None = PrivateAttr(default=None)

    @staticmethod
    def sensitive_keys() -> list[str]:
        return ["api_key"]

    @property
    def client(self) -> SIEClient:
        if self._client is None:
            self._client = SIEClient(self.target, api_key=self.api_key)
        return self._client

    def ndims(self) -> int:
        """The requested dims, else the model's width (probed once)."""
        if self._dims is None and self.dims:
            self._dims = self.dims
        elif self._dims is None:
            (probe,) = self.generate_embeddings(["dimension probe"])
            assert probe is not None  # only a null row gets no vector
            self._dims = len(probe)
        return self._dims

    def compute_query_embeddings(self, query: str, *args: Any, **kwargs: Any) -> list[np.ndarray | None]:
        return self._encode(self.sanitize_input(query), is_query=True)

    def generate_embeddings(self, texts: Any, *args: Any, **kwargs: Any) -> list[np.ndarray | None]:
        return self._encode(texts, is_query=False)

    def _encode(self, texts: Any, *, is_query: bool) -> list[np.ndarray | None]:
        """A null row (None) gets a null vector, as LanceDB's own functions give it, not the vector of the text
        "None"."""
        texts = list(texts)
        present = [index for index, text in enumerate(texts) if text is not None]
        vectors: list[np.ndarray | None] = [None] * len(texts)
        results = self.client.encode(
            self.model, [str(texts[index]) for index in present], is_query=is_query, dims=self.dims, output_types=DENSE
        )
        for index, result in zip(present, results, strict=True):
            vectors[index] = result["dense"]
        return vectors

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
