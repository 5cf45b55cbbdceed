"""`progress=True` on every verb draws a tqdm bar of the items answered (captured from stderr), and without tqdm the
call fails before sending anything, naming the extra that installs it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from client_observation import requests_answered
from sie_client import SIEClient

MODEL = "test/tiny-mean"
RERANKER = "test/tiny-reranker"
EXTRACTOR = "test/tiny-ner"
TEXTS = [f"Angela Merkel visited Paris, visit number {n}" for n in range(7)]


@pytest.fixture(scope="module")
def client(worker):
    with SIEClient(worker.address, stream_batch_size=3) as client:  # several requests per list
        yield client


@pytest.mark.parametrize(
    ("verb", "call"),
    [
        ("encode", lambda c, **o: [r["dense"] for r in c.encode(MODEL, TEXTS, **o)]),
        ("score", lambda c, **o: [(s["index"], s["score"]) for s in c.score(RERANKER, "who?", TEXTS, **o)["scores"]]),
        ("extract", lambda c, **o: [[e["score"] for e in r["entities"]] for r in c.extract(EXTRACTOR, TEXTS, **o)]),
    ],
)
def test_progress_draws_a_bar_of_the_items_answered(client, capsys, verb, call) -> None:
    quiet = call(client)
    assert capsys.readouterr().err == ""
    shown = call(client, progress=True)
    assert len(shown) == len(TEXTS)
    for with_bar, without in zip(shown, quiet, strict=True):
        np.testing.assert_allclose(with_bar, without, atol=1e-5)
    bar = capsys.readouterr().err
    assert verb in bar and f"{len(TEXTS)}/{len(TEXTS)}" in bar, bar


async def test_progress_on_the_async_client(worker, capsys) -> None:
    from sie_client import AsyncSIEClient

    async with AsyncSIEClient(worker.address) as client:
        await client.extract(EXTRACTOR, TEXTS, progress=True)
        await client.score(RERANKER, "q", TEXTS[:2], progress=True)
    bar = capsys.readouterr().err
    assert "7/7" in bar and "2/2" in bar, bar


def test_without_tqdm_the_error_names_the_extra_and_nothing_is_sent(worker, client, monkeypatch) -> None:
    # tqdm made unimportable, as in an environment without the extra: its modules forgotten, and None in
    # sys.modules stops its import (ModuleNotFoundError, name "tqdm").
    for name in [name for name in sys.modules if name.startswith("tqdm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    for verb, model, call in (
        ("encode", MODEL, lambda: client.encode(MODEL, TEXTS, progress=True)),
        ("score", RERANKER, lambda: client.score(RERANKER, "q", TEXTS, progress=True)),
        ("extract", EXTRACTOR, lambda: client.extract(EXTRACTOR, TEXTS, progress=True)),
    ):
        before = requests_answered(worker, model, verb)
        with pytest.raises(ModuleNotFoundError) as raised:
            call()
        assert str(raised.value) == (
            "progress=True needs tqdm, which the client's `progress` extra installs: "
            "pip install './clients/python[progress]' (from a checkout of SIE)"
        )
        assert raised.value.name == "tqdm"
        assert requests_answered(worker, model, verb) == before
    assert len(client.encode(MODEL, TEXTS)) == len(TEXTS)  # without progress nothing needs tqdm
