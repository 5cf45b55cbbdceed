"""The planner's checks that need only a model's config (sie_worker.engine.plan), in-process: a request for a task,
input, LoRA or output the config does not list, or whose dense answer could not be sent, is refused with its reason
before the model is loaded (a registry that only knows configs stands in for the worker's)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from sie_common.cluster.model_config import ModelConfig, Profile
from sie_common.edge.errors import InvalidArgument, ResourceExhausted
from sie_worker.engine.jobs import EncodeJob, ExtractJob, ImageInput, ItemInput, ScoreJob
from sie_worker.engine.limits import Limits
from sie_worker.engine.plan import Planner
from sie_worker.settings import WorkerSettings

ENCODER = ModelConfig(
    id="org/encoder",
    source="test",
    tasks=("encode", "score"),
    output_types=("dense", "sparse"),
    dims=384,
    profiles={"default": Profile(adapter="sentence_transformer")},
    loras={"legal": "/loras/legal", "medical": "/loras/medical"},
)
DUAL = ModelConfig(id="org/dual", source="test", inputs=("text", "image"), tasks=("encode", "score"), dims=512)
NO_DIMS = ModelConfig(id="org/no-dims", source="test", tasks=("encode",), output_types=("dense",))
MAX_SEND_BYTES = 4 * 2**20


class ConfigsOnly:
    """A registry that knows its models' configs and loads nothing: the planner must refuse before it asks."""

    def config(self, model_id: str) -> ModelConfig:
        return {config.id: config for config in (ENCODER, DUAL, NO_DIMS)}[model_id]

    def use(self, model_id: str, profile: str) -> contextlib.AbstractContextManager[object]:
        raise AssertionError(f"{model_id} was loaded for a request the planner should have refused")


@pytest.fixture(scope="module")
def planner() -> Iterator[Planner]:
    with ThreadPoolExecutor(max_workers=1) as device_thread:
        yield Planner(ConfigsOnly(), Limits.from_settings(WorkerSettings()), MAX_SEND_BYTES, device_thread)  # type: ignore[arg-type]


def refusal(planner: Planner, job: EncodeJob | ScoreJob | ExtractJob, kind: type[Exception] = InvalidArgument) -> Exception:
    with contextlib.ExitStack() as holds, pytest.raises(kind) as raised:
        planner.plan(job, holds)
    return raised.value


TEXT = ItemInput("a text", (), "t", 0)
IMAGE = ItemInput(None, (ImageInput(b"\x89PNG"),), "picture", 1)


def test_a_task_the_config_does_not_list_names_what_the_model_supports(planner: Planner) -> None:
    error = refusal(planner, ExtractJob(model=ENCODER.id, items=[TEXT]))
    assert error.reason == "OPERATION_NOT_SUPPORTED"
    assert error.metadata == {"model": ENCODER.id, "operation": "extract"}
    assert error.message == "model org/encoder does not support extract; it supports: encode, score"


def test_an_image_to_a_text_model_names_the_item_and_the_models_inputs(planner: Planner) -> None:
    error = refusal(planner, EncodeJob(model=ENCODER.id, items=[TEXT, IMAGE]))
    assert error.reason == "INPUT_NOT_SUPPORTED"
    assert error.metadata == {"item": "1", "item_id": "picture", "input": "image", "model": ENCODER.id}
    assert error.message == "items[1] (id 'picture'): model org/encoder does not take image input; its inputs: text"


def test_a_score_query_is_checked_like_the_items(planner: Planner) -> None:
    query = ItemInput(None, (ImageInput(b"\x89PNG"),), "", None)
    error = refusal(planner, ScoreJob(model=ENCODER.id, query=query, items=[TEXT]))
    assert error.reason == "INPUT_NOT_SUPPORTED" and error.metadata["item"] == "query"


def test_an_unknown_lora_lists_the_models_adapters(planner: Planner) -> None:
    error = refusal(planner, EncodeJob(model=ENCODER.id, items=[TEXT], lora="finance"))
    assert error.reason == "LORA_NOT_FOUND" and error.metadata == {"lora": "finance"}
    assert error.message == "lora: model org/encoder has no LoRA adapter 'finance'; it has: legal, medical"
    assert "it has: none" in refusal(planner, EncodeJob(model=DUAL.id, items=[TEXT], lora="x")).message


def test_an_output_the_config_does_not_list_is_refused(planner: Planner) -> None:
    error = refusal(planner, EncodeJob(model=ENCODER.id, items=[TEXT], output_types=("dense", "multivector")))
    assert error.reason == "OUTPUT_NOT_SUPPORTED" and error.metadata == {"output_type": "multivector"}


def test_a_dense_answer_too_large_for_a_message_is_refused_with_the_configs_dims(planner: Planner) -> None:
    fits = MAX_SEND_BYTES // (384 * 4) - 1  # one vector's room is left for the envelope
    error = refusal(planner, EncodeJob(model=ENCODER.id, items=[TEXT] * (fits + 2)), ResourceExhausted)
    assert error.reason == "RESPONSE_TOO_LARGE"
    with pytest.raises(AssertionError, match="was loaded"):  # just under the limit: planned, so the model loads
        refusal(planner, EncodeJob(model=ENCODER.id, items=[TEXT] * fits))


def test_smaller_dims_or_dtype_or_no_dense_make_the_same_items_fit(planner: Planner) -> None:
    items = [TEXT] * (MAX_SEND_BYTES // (384 * 4) + 2)
    for job in (
        EncodeJob(model=ENCODER.id, items=items, dims=64),
        EncodeJob(model=ENCODER.id, items=items, output_dtype="binary"),
        EncodeJob(model=ENCODER.id, items=items, output_types=("sparse",)),
    ):
        with pytest.raises(AssertionError, match="was loaded"):
            refusal(planner, job)


def test_asking_for_more_dims_than_the_config_states_does_not_hide_a_too_large_answer(planner: Planner) -> None:
    items = [TEXT] * (MAX_SEND_BYTES // (384 * 4) + 2)
    error = refusal(planner, EncodeJob(model=ENCODER.id, items=items, dims=2**31 - 1), ResourceExhausted)
    assert error.reason == "RESPONSE_TOO_LARGE" and error.metadata["size"] == str(len(items) * 384 * 4)


def test_a_config_without_dims_is_estimated_only_once_the_model_tells_its_width(planner: Planner) -> None:
    """The gateway and the plan refuse by one rule (sie_common.edge.answer_size.stated_dims): a request's own dims
    are not a width (more than the model has is refused once it is loaded, as DIMS_TOO_LARGE), so a config
    without dims refuses nothing before the load, whatever dims are asked for."""
    items = [TEXT] * (MAX_SEND_BYTES // (256 * 4) + 2)
    for dims in (None, 256, 2**31 - 1):
        with pytest.raises(AssertionError, match="was loaded"):
            refusal(planner, EncodeJob(model=NO_DIMS.id, items=items, dims=dims))
