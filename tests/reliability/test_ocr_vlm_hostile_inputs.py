"""Adversarial input against the OCR vision-language models (adapter ocr_vlm, issue 36), served by one real worker from
tiny random replicas (tools/tiny_ocr_vlms.py) through the shipped PaddlePaddle/PaddleOCR-VL-1.5 config.

What broke: PaddleOCR-VL's resize refuses a page more elongated than 200:1 (once each side is scaled to at least one
merged patch) by raising; the worker asks it the page's resized size from the header, before its own aspect ratio
bound, so a 1x250 PNG answered INTERNAL. The worker here allows pages up to 400:1 (SIE_MAX_IMAGE_ASPECT_RATIO), so a
page between 200:1 and 400:1 reaches the family's own check (INVALID_ITEM) and one past 400:1 the worker's bound.
What held is kept here too: a good request beside a refused one is answered.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from google.protobuf import json_format
from PIL import Image

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_ocr_vlms import build_tiny_paddleocr_vl
from worker_process import Services, inference_stub

CATALOG = Path(__file__).resolve().parents[2] / "catalog" / "models"
PADDLE = "PaddlePaddle/PaddleOCR-VL-1.5"
MAX_ASPECT_RATIO = 400


def png(size: tuple[int, int], seed: int = 0) -> bytes:
    pixels = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


PAGE = png((40, 48))


@pytest.fixture(scope="module")
def stub(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[inference_pb2_grpc.InferenceStub]:
    replica = build_tiny_paddleocr_vl(tmp_path_factory.mktemp("adv-ocr") / "paddleocr-vl")
    configs = tmp_path_factory.mktemp("adv-ocr-configs")
    shipped = yaml.safe_load((CATALOG / f"{PADDLE.replace('/', '__')}.yaml").read_text())
    del shipped["hf_id"]
    (configs / "paddle.yaml").write_text(yaml.safe_dump({**shipped, "path": str(replica)}))
    bundles = tmp_path_factory.mktemp("adv-ocr-bundles")
    (bundles / "ocr.yaml").write_text("id: ocr\nadapters: [ocr_vlm]\npriority: 0\n")
    worker = services.worker(
        {
            "SIE_MODELS_DIR": str(configs),
            "SIE_PRELOAD_MODELS": PADDLE,
            "SIE_BUNDLES_DIR": str(bundles),
            "SIE_BUNDLE": "ocr",
            "SIE_MAX_IMAGE_ASPECT_RATIO": str(MAX_ASPECT_RATIO),
        },
        name="adv-ocr",
    )
    with inference_stub(worker) as stub:
        yield stub


def request(pages: list[bytes], **options: Any) -> inference_pb2.ExtractRequest:
    items = [types_pb2.Item(id=str(row), images=[types_pb2.Image(data=page)]) for row, page in enumerate(pages)]
    message = inference_pb2.ExtractRequest(model=PADDLE, items=items)
    message.options.update({"max_new_tokens": 3, **options})
    return message


def texts(stub, pages: list[bytes]) -> list[str]:
    response, _ = call_until_loaded(lambda: stub.Extract(request(pages), timeout=120))
    return [json_format.MessageToDict(result.data)["text"] for result in response.results]


def refusal(stub, pages: list[bytes]) -> grpc.RpcError:
    texts(stub, [PAGE])  # loaded
    with pytest.raises(grpc.RpcError) as raised:
        stub.Extract(request(pages), timeout=120)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    return raised.value


@pytest.mark.parametrize("size", [(1, 250), (250, 1), (2, 450)], ids=["1x250", "250x1", "2x450"])
def test_a_page_too_elongated_for_the_processor_is_an_invalid_item(stub, size: tuple[int, int]) -> None:
    """Within the worker's 400:1 but past the processor's 200:1: the item is named, not INTERNAL."""
    error = refusal(stub, [PAGE, png(size)])
    assert error_info(error).reason == "INVALID_ITEM"
    assert error_info(error).metadata["item"] == "1"
    assert "too elongated" in error.details()


@pytest.mark.parametrize("size", [(1, 450), (450, 1)], ids=["1x450", "450x1"])
def test_a_page_past_the_worker_aspect_ratio_is_refused_from_its_header(stub, size: tuple[int, int]) -> None:
    assert error_info(refusal(stub, [png(size)])).reason == "IMAGE_ASPECT_RATIO_TOO_LARGE"


def test_an_elongated_page_the_processor_takes_is_read(stub) -> None:
    """5x250 is 50:1 before the processor scales its short side to one merged patch (5:1400, under 200:1)."""
    assert len(texts(stub, [png((5, 250))])) == 1


def test_a_refused_request_does_not_fail_its_neighbours(stub) -> None:
    """Requests answered while elongated pages are refused beside them: each gets its own answer."""
    expected = texts(stub, [PAGE])
    answers: list[Any] = []

    def good() -> None:
        answers.append(texts(stub, [PAGE]))

    def bad() -> None:
        try:
            stub.Extract(request([png((1, 300))]), timeout=120)
        except grpc.RpcError as error:
            answers.append(error.code())

    threads = [threading.Thread(target=target) for target in (good, bad, good, bad, good)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(map(str, answers)) == sorted([str(expected)] * 3 + [str(grpc.StatusCode.INVALID_ARGUMENT)] * 2)
