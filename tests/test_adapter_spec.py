"""What a family declares (sie_worker.adapters.spec) is checked when its class is defined, found without a list of
names, and what a model config is checked against at load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_common.cluster.model_config import parse_model_config
from sie_worker.adapters import ADAPTERS
from sie_worker.adapters.contract import Adapter, Input, Prepared, Query
from sie_worker.adapters.spec import AdapterSpec, Option


def config(**body: Any) -> Any:
    return parse_model_config({"id": "x/model", "hf_id": "x/model", **body}, source="test")


def test_every_family_is_found_by_its_own_name() -> None:
    assert sorted(ADAPTERS) == sorted(
        [
            "bge_m3", "clip", "colbert", "colpali", "cross_encoder", "document_reader", "gliclass", "gliner", "gliner2", "glirel",
            "llm_reranker", "nli_zero_shot", "ocr_vlm", "sentence_transformer", "splade", "text_classifier", "token_classifier",
            "zero_shot_detector", "qwen3_vl_embedder", "qwen3_vl_reranker",
        ]
    )  # fmt: skip
    assert all(cls.spec.name == name and not cls.spec.problems() for name, cls in ADAPTERS.items())


@pytest.mark.parametrize(
    "spec, methods, problem",
    [
        (AdapterSpec("e", tasks=("encode",)), {"prepare", "run"}, "an encoder must declare its outputs"),
        (
            AdapterSpec("s", tasks=("score",), pairs=True, outputs=("dense",)),
            {"prepare", "run"},
            "outputs are an encoder's",
        ),
        (
            AdapterSpec("l", tasks=("encode",), outputs=("dense",), labels=True),
            {"prepare", "run"},
            "labels are an extractor's",
        ),
        (AdapterSpec("Bad-Name", tasks=("extract",)), {"prepare", "run", "finish"}, "is not lowercase"),
        (AdapterSpec("t", tasks=("translate",)), {"prepare", "run"}, "tasks ['translate'] are not among"),
        (
            AdapterSpec("i", tasks=("encode",), inputs=("image",), outputs=("dense",)),
            {"prepare", "run"},
            "resizes them to",
        ),
        (AdapterSpec("r", tasks=("encode",), outputs=("dense",)), {"prepare"}, "does not implement run"),
        (AdapterSpec("p", tasks=("encode",), outputs=("dense",)), {"run"}, "neither prepare nor prepare_one"),
        (AdapterSpec("x", tasks=("extract",)), {"prepare", "run"}, "does not implement finish"),
        (
            AdapterSpec("o", tasks=("encode",), outputs=("dense",), options=(Option("a", ""), Option("a", ""))),
            {"prepare", "run"},
            "name one option twice",
        ),
        (
            AdapterSpec("k", tasks=("encode",), outputs=("dense",), options=(Option("a", "", tasks=("score",)),)),
            {"prepare", "run"},
            "read for tasks it does not serve",
        ),
    ],
)
def test_a_family_that_declares_wrongly_or_lacks_what_it_declares_is_refused_when_defined(
    spec: AdapterSpec, methods: set[str], problem: str
) -> None:
    def prepare(self: Adapter, items: Sequence[Input], query: Query) -> list[Prepared]:
        return []

    def run(self: Adapter, batch: Sequence[Any], query: Query) -> list[Any]:
        return []

    def finish(self: Adapter, item: Input, prepared: Any, output: Any, query: Query) -> Any:
        return output

    body: dict[str, Any] = {"spec": spec}
    body.update(
        {name: method for name, method in (("prepare", prepare), ("run", run), ("finish", finish)) if name in methods}
    )
    with pytest.raises(TypeError, match="adapter Family") as raised:
        type("Family", (Adapter,), body)
    assert problem in str(raised.value)


def test_a_config_may_ask_only_for_what_its_adapter_serves() -> None:
    splade = ADAPTERS["splade"].spec
    splade.check_config(config(tasks=["encode"], output_types=["sparse"], profiles={"default": {"adapter": "splade"}}))
    with pytest.raises(ValueError, match="tasks: adapter splade does not do score; it does: encode"):
        splade.check_config(config(tasks=["score"], profiles={"default": {"adapter": "splade"}}))
    with pytest.raises(ValueError, match="output_types: adapter splade does not produce dense; it produces: sparse"):
        splade.check_config(config(output_types=["dense"], profiles={"default": {"adapter": "splade"}}))
    with pytest.raises(ValueError, match="inputs: adapter splade does not take images"):
        splade.check_config(
            config(inputs=["text", "image"], output_types=["sparse"], profiles={"default": {"adapter": "splade"}})
        )
    colbert = ADAPTERS["colbert"].spec  # dense from its multivectors (MUVERA)
    colbert.check_config(
        config(tasks=["encode", "score"], output_types=["dense"], profiles={"default": {"adapter": "colbert"}})
    )
    assert colbert.uses_muvera and not ADAPTERS["bge_m3"].spec.uses_muvera


def test_an_options_tasks_decide_which_requests_may_give_it() -> None:
    bge_m3 = ADAPTERS["bge_m3"].spec
    assert bge_m3.option_names("score") == ("score_mode", "score_weights")
    assert bge_m3.option_names("encode") == ()


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None, database=None)
@given(value=_json)
def test_an_options_declared_check_refuses_any_value_out_of_bounds_with_a_value_error(value: Any) -> None:
    """Whatever JSON a request sends for a declared option, its check passes it or says why (ValueError, answered
    INVALID_OPTIONS): no other error (which would answer INTERNAL)."""
    for family in ADAPTERS.values():
        for option in family.spec.options:
            if option.check is None:
                continue
            try:
                option.check(value)
            except ValueError as error:
                assert str(error)
