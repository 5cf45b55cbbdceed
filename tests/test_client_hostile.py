"""Hostile arguments to the client that need no server: waits that would never end or would flood it,
credentials in a URL that would be dropped, ports that would silently change, items that would be misread."""

from __future__ import annotations

import math

import pytest

from sie_client import ItemError, SIEClient


@pytest.fixture
def unreachable():
    """A client of a port nothing listens on: these arguments must be refused before any call."""
    with SIEClient("localhost:1", timeout_s=1) as client:
        yield client


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"poll_s": 0.0}, "poll_s"),
        ({"poll_s": -0.5}, "poll_s"),
        ({"poll_s": math.nan}, "poll_s"),
        ({"poll_s": math.inf}, "poll_s"),
    ],
)
def test_waits_that_would_never_end_or_never_pause_are_value_errors(unreachable, kwargs: dict, message: str) -> None:
    interval = {("poll_interval_s" if key == "poll_s" else key): value for key, value in kwargs.items()}
    with pytest.raises(ValueError, match=message.replace("poll_s", "poll_interval_s")):
        unreachable.wait_for_capacity("default", model="any/model", **interval)
    with pytest.raises(ValueError, match=message):
        unreachable.create_pool("p", {"default": 1}, min_workers=1, **kwargs)


@pytest.mark.parametrize("kwargs", [{"provision_timeout_s": math.nan}, {"provision_timeout_s": -1.0}, {"max_oom_retries": -1}])
def test_a_nan_or_negative_retry_budget_is_refused_per_call(unreachable, kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        unreachable.encode("any/model", "x", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": math.nan}, "timeout_s"),  # every call failed at once as DEADLINE_EXCEEDED
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"stream_window": 0}, "stream_window"),  # a long list was never sent
        ({"stream_batch_size": 0}, "stream_batch_size"),  # range() arg 3 must not be zero
    ],
)
def test_client_settings_that_would_fail_every_call_are_value_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SIEClient("localhost:1", **kwargs)


@pytest.mark.parametrize(
    "target",
    [
        "http://user:secret@localhost:8080",  # the credentials would be dropped: the caller believes it authenticates
        "http://token@localhost:8080",
        "http://localhost:0",  # was port 80
        "localhost:0",
        "localhost:99999",
        "localhost:",
        "http://localhost:65536",
    ],
)
def test_credentials_in_a_url_and_ports_that_are_not_ports_are_value_errors(target: str) -> None:
    with pytest.raises(ValueError, match="credentials|port"):
        SIEClient(target)


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"text": "x", "images": "photo.jpg"}, "images"),  # was read as files 'p', 'h', 'o', ...
        ({"text": "x", "images": b"\\x89PNG"}, "images"),  # was one image per byte
        ({"id": 7, "text": "x"}, "id"),
        ({"text": 3.5}, "text"),
        ({"text": "x", "metadata": "tag"}, "metadata"),
        ({"text": "x", "metadata": {1: "one"}}, "metadata"),
    ],
)
def test_item_fields_of_the_wrong_type_are_item_errors_naming_the_field(unreachable, item: dict, field: str) -> None:
    with pytest.raises(ItemError) as refused:
        unreachable.encode("any/model", item)
    assert refused.value.metadata == {"field": field}


async def test_empty_lists_give_empty_lists_without_a_request(worker) -> None:
    """A list in, a list out: the server refuses a request without items (NO_ITEMS), so the client sends none,
    and the embedding integrations that pass their list through (LangChain, LlamaIndex) return [] as their
    frameworks expect."""
    from sie_client.integrations.langchain import SIEEmbeddings
    from sie_client.integrations.llamaindex import SIEEmbedding

    with SIEClient(worker.address) as client:
        assert client.encode("test/tiny-mean", []) == []
        assert client.extract("test/tiny-ner", []) == []
    embeddings = SIEEmbeddings(worker.address, "test/tiny-mean")
    embedding = SIEEmbedding(worker.address, "test/tiny-mean")
    try:
        assert embeddings.embed_documents([]) == []
        assert await embeddings.aembed_documents([]) == []
        assert embedding.get_text_embedding_batch([]) == []
    finally:
        embeddings.close()
        embedding.close()


def test_lancedb_gives_a_null_row_a_null_vector_not_the_vector_of_the_text_none(worker) -> None:
    import numpy as np
    from lancedb.embeddings import get_registry

    import sie_client.integrations.lancedb  # noqa: F401  (registers "sie")

    function = get_registry().get("sie").create(target=worker.address, model="test/tiny-mean")
    with SIEClient(worker.address) as client:
        expected = client.encode("test/tiny-mean", "a row")["dense"]
    try:
        vectors = function.compute_source_embeddings(["a row", None])
        assert vectors[1] is None
        np.testing.assert_allclose(vectors[0], expected, atol=1e-6)
        assert function.compute_source_embeddings([None]) == [None]
    finally:
        function.close()


def test_a_long_extract_list_goes_as_several_requests_in_order(worker) -> None:
    """9,000 items is over the server's SIE_MAX_ITEMS_PER_REQUEST (8,192): refused as TOO_MANY_ITEMS in one request.
    Like encode's, extract's long lists go in stream_batch_size chunks, and the results keep the input order."""
    texts = [f"item {n} in Paris" for n in range(9000)]
    with SIEClient(worker.address, stream_batch_size=1000) as client:
        results = client.extract("test/tiny-ner", [{"id": str(n), "text": text} for n, text in enumerate(texts)])
        assert [result["id"] for result in results] == [str(n) for n in range(9000)]
        assert results[1234]["entities"] == client.extract("test/tiny-ner", {"id": "1234", "text": texts[1234]})["entities"]
        with pytest.raises(ItemError):  # a bad item in a later chunk fails the call, before anything is sent
            client.extract("test/tiny-ner", texts[:1500] + [{"text": "x", "colour": "red"}])


def test_normalize_sparse_keeps_the_direction_of_huge_weights() -> None:
    from sie_client import encoding

    assert encoding.normalize_sparse({1: 3e200, 2: 4e200}) == pytest.approx({1: 0.6, 2: 0.8})
    assert encoding.normalize_sparse({1: 3e-200, 2: 4e-200}) == pytest.approx({1: 0.6, 2: 0.8})


def test_clients_dropped_without_close_do_not_keep_their_threads() -> None:
    """LangChain's and LlamaIndex's protocols have no close(): an integration object (and the SIEClient it holds)
    dropped without one kept a thread, an event loop and a channel for the life of the process (70 of them here)."""
    import gc
    import threading

    from sie_client.integrations.langchain import SIEEmbeddings

    def client_threads() -> int:
        return sum(thread.name == "sie-client" for thread in threading.enumerate())

    before = client_threads()
    for _ in range(50):
        SIEClient("localhost:1")
    for _ in range(20):
        SIEEmbeddings("localhost:1", "any/model")
    gc.collect()
    assert client_threads() == before
    closed = SIEClient("localhost:1")
    closed.close()
    closed.close()  # a second close does nothing
    assert client_threads() == before
