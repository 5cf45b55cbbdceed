"""The real Engine, in-process around fake adapters (tests/fake_adapter.py): encode, score and extract through every
stage (admission, plan, prepare, device loop, answer) with no subprocess, their answers computed in advance, and the
refusals each stage answers."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fake_adapter import (
    FAKE_DIMS,
    FAKE_ENCODER,
    FAKE_EXTRACTOR,
    FAKE_SCORER,
    adapter_of,
    fake_dense,
    fake_engine,
    fake_maxsim,
    fake_multivector,
    items,
    token_ids,
)
from sie_common.edge.errors import InvalidArgument, NotFound, SieError
from sie_worker.adapters.items import EncodedItem
from sie_worker.engine.engine import Engine
from sie_worker.engine.jobs import EncodeJob, ExtractJob, ItemInput, ScoreJob


def fake_maxsim_of(query: str, text: str) -> float:
    return fake_maxsim(
        EncodedItem(multivector=fake_multivector(token_ids(query))),
        EncodedItem(multivector=fake_multivector(token_ids(text))),
    )


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (40, 80, 120)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    # A long batch wait, so that requests sent together share batches whatever the machine's load.
    async with fake_engine(tmp_path_factory.mktemp("fakes"), max_batch_wait_ms=200.0, adaptive_batching=False) as built:
        yield built


async def refusal(call: asyncio.Future | object) -> SieError:
    with pytest.raises(SieError) as raised:
        await call  # type: ignore[misc]
    return raised.value


async def test_encode_answers_each_items_outputs_in_order(engine: Engine) -> None:
    texts = ["hello", "a longer text than the first", "x"]
    outcome = await engine.encode(EncodeJob(FAKE_ENCODER, items(*texts), output_types=("dense", "multivector")))
    assert [output.dense.values.tolist() for output in outcome.items] == [
        fake_dense(token_ids(t)).tolist() for t in texts
    ]
    assert [output.multivector.values.shape for output in outcome.items] == [(len(t), 2) for t in texts]
    assert outcome.tokens == sum(map(len, texts))


async def test_the_plan_carries_the_query_to_the_adapter_and_the_answer(engine: Engine) -> None:
    """is_query and the instruction reach the adapter's prompt; dims and the dtype shape the answer."""
    queried = await engine.encode(EncodeJob(FAKE_ENCODER, items("abc"), is_query=True, dims=2))
    instructed = await engine.encode(
        EncodeJob(FAKE_ENCODER, items("abc"), instruction="find: ", output_dtype="float16")
    )
    assert queried.items[0].dense.values.tolist() == fake_dense(token_ids("q: abc"))[:2].tolist()
    assert instructed.items[0].dense.dtype == "float16"
    assert np.allclose(instructed.items[0].dense.values, fake_dense(token_ids("find: abc")), rtol=1e-3)


async def test_texts_and_images_of_one_request_run_in_batches_of_their_own_and_answer_in_order(engine: Engine) -> None:
    fake = adapter_of(engine, FAKE_ENCODER)
    before = len(fake.runs)
    outcome = await engine.encode(EncodeJob(FAKE_ENCODER, [*items("text one", images=[png(30, 20)]), *items("two")]))
    assert sorted(fake.runs[before:]) == [("image", 1), ("text", 2)]
    assert outcome.items[0].dense.values.tolist() == fake_dense(token_ids("text one")).tolist()
    assert outcome.items[1].dense.values.tolist() == fake_dense([30 % 97 + 1, 20 % 97 + 1]).tolist()
    assert outcome.items[2].dense.values.tolist() == fake_dense(token_ids("two")).tolist()


async def test_concurrent_requests_share_a_batch_only_when_their_queries_agree(engine: Engine) -> None:
    fake = adapter_of(engine, FAKE_ENCODER)
    before = len(fake.runs)
    await asyncio.gather(
        engine.encode(EncodeJob(FAKE_ENCODER, items("a", "b"))),
        engine.encode(EncodeJob(FAKE_ENCODER, items("c"))),
        engine.encode(EncodeJob(FAKE_ENCODER, items("d"), is_query=True)),
    )
    assert sorted(fake.runs[before:]) == [("text", 1), ("text", 3)]


async def test_a_pair_scorer_ranks_the_items_by_its_scores(engine: Engine) -> None:
    outcome = await engine.score(ScoreJob(FAKE_SCORER, ItemInput("abcd"), items("xyz", "abcd", "ab"), top_k=2))
    assert [(scored.index, scored.score) for scored in outcome.ranked] == [(1, 1.0), (2, 0.5)]
    assert outcome.tokens == (3 + 1) + (4 + 1) + (2 + 1)  # every pair the scorer read, those cut by top_k too


async def test_a_score_by_embeddings_compares_each_item_with_the_query(engine: Engine) -> None:
    texts = ["abc", "zzzz", "q: ab"]
    outcome = await engine.score(ScoreJob(FAKE_ENCODER, ItemInput("ab"), items(*texts)))
    query = fake_dense(token_ids("q: ab"))
    cosines = [
        float(fake_dense(token_ids(t)) @ query / np.linalg.norm(fake_dense(token_ids(t))) / np.linalg.norm(query))
        for t in texts
    ]
    assert [scored.index for scored in outcome.ranked] == sorted(range(3), key=lambda index: -cosines[index])
    assert [scored.score for scored in outcome.ranked] == pytest.approx(sorted(cosines, reverse=True), abs=1e-6)
    assert outcome.tokens == len("q: ab") + sum(map(len, texts))  # the query (with its prompt) once, each item


async def test_extract_finds_the_labels_within_the_options_bounds(engine: Engine) -> None:
    outcome = await engine.extract(
        ExtractJob(FAKE_EXTRACTOR, items("Ada met Alan in London"), labels=("London", "Ada"))
    )
    assert [(entity.text, entity.start) for entity in outcome.results[0].entities] == [("Ada", 0), ("London", 16)]
    kept = await engine.extract(
        ExtractJob(FAKE_EXTRACTOR, items("Ada met Alan in London"), labels=("London", "Ada"), options={"max_found": 1})
    )
    assert [entity.text for entity in kept.results[0].entities] == ["Ada"]
    bad = await refusal(engine.extract(ExtractJob(FAKE_EXTRACTOR, items("x"), labels=("x",), options={"max_found": 0})))
    assert (bad.reason, bad.message) == (
        "INVALID_OPTIONS",
        "options: max_found: must be a whole number from 1 to 10, got 0",
    )


async def test_the_adapters_refusals_reach_the_caller_with_their_reason_and_item(engine: Engine) -> None:
    label = await refusal(engine.extract(ExtractJob(FAKE_EXTRACTOR, items("a"), labels=("forbidden",))))
    assert isinstance(label, InvalidArgument) and label.reason == "INVALID_LABEL"
    item = await refusal(engine.extract(ExtractJob(FAKE_EXTRACTOR, items("fine", "unreadable"), labels=("a",))))
    assert (item.reason, item.message) == ("INVALID_ITEM", "items[1] (id 't1'): this text cannot be read")
    assert item.metadata == {"item": "1", "item_id": "t1"}
    none = await refusal(engine.extract(ExtractJob(FAKE_EXTRACTOR, items("a"))))
    assert none.reason == "NO_LABELS"


async def test_the_plan_refuses_what_the_model_does_not_serve(engine: Engine) -> None:
    assert isinstance(await refusal(engine.encode(EncodeJob("fake/none", items("a")))), NotFound)
    assert (
        await refusal(engine.extract(ExtractJob(FAKE_ENCODER, items("a"), labels=("a",))))
    ).reason == "OPERATION_NOT_SUPPORTED"
    assert (await refusal(engine.encode(EncodeJob(FAKE_ENCODER, items("a"), lora="other")))).reason == "LORA_NOT_FOUND"
    image = await refusal(engine.score(ScoreJob(FAKE_SCORER, ItemInput("q"), items(images=[png(4, 4)]))))
    assert image.reason == "INPUT_NOT_SUPPORTED"
    assert (
        await refusal(engine.encode(EncodeJob(FAKE_ENCODER, items("a"), dims=FAKE_DIMS + 1)))
    ).reason == "DIMS_TOO_LARGE"


async def test_an_item_the_model_fails_on_fails_alone(engine: Engine) -> None:
    """The batch is retried in halves: the other items are answered, the failing one is ITEM_FAILED."""
    failed = await refusal(engine.encode(EncodeJob(FAKE_ENCODER, items("boom"))))
    assert failed.reason == "ITEM_FAILED"
    outcome = await engine.encode(EncodeJob(FAKE_ENCODER, items("fine")))
    assert outcome.items[0].dense.values.tolist() == fake_dense(token_ids("fine")).tolist()


async def test_multivectors_are_bounded_before_the_forward_pass(tmp_path: Path) -> None:
    """Counted from the prepared items: an encode's all, a score's items but not its query."""
    async with fake_engine(tmp_path, max_score_multivector_bytes=2 * 4 * 10) as small:  # 10 rows of 2 floats
        fake = adapter_of(small, FAKE_ENCODER)
        refused = await refusal(
            small.encode(EncodeJob(FAKE_ENCODER, items("abcdef", "ghijk"), output_types=("multivector",)))
        )
        assert refused.reason == "MULTIVECTORS_TOO_LARGE" and fake.runs == []
        by_rows = {"compare": "multivector"}
        held = await refusal(
            small.score(ScoreJob(FAKE_ENCODER, ItemInput("q"), items("abcdef", "ghijk"), options=by_rows))
        )
        assert held.reason == "SCORE_TOO_LARGE" and fake.runs == []
        query = "a long query of many rows"
        scored = await small.score(ScoreJob(FAKE_ENCODER, ItemInput(query), items("abc", "ghi"), options=by_rows))
        scores = {entry.index: entry.score for entry in scored.ranked}
        assert scores == {index: fake_maxsim_of("q: " + query, text) for index, text in enumerate(["abc", "ghi"])}


async def test_an_option_the_model_does_not_read_is_refused_naming_it_and_those_it_reads(engine: Engine) -> None:
    """A typo, a field sent as an option, or an option of another task is UNKNOWN_OPTION, not ignored."""
    field = await refusal(engine.encode(EncodeJob(FAKE_ENCODER, items("a"), options={"dims": 3})))
    assert (field.reason, dict(field.metadata)) == ("UNKNOWN_OPTION", {"option": "dims", "accepted": ""})
    assert "reads no option 'dims' for encode; it reads: none" in field.message
    other_task = await refusal(engine.encode(EncodeJob(FAKE_ENCODER, items("a"), options={"compare": "multivector"})))
    assert other_task.reason == "UNKNOWN_OPTION"
    typo = await refusal(engine.extract(ExtractJob(FAKE_EXTRACTOR, items("a"), labels=("a",), options={"max_fund": 1})))
    assert dict(typo.metadata) == {"option": "max_fund", "accepted": "max_found"}
    assert typo.message.endswith("it reads: max_found")
