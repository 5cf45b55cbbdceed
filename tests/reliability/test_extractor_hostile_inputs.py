"""Adversarial input against the extractors and page retrievers of issue 24: the generic extract path, the NLI
zero-shot classifier, the GroundingDINO / OWLv2 detectors and ColPali / ColQwen2, on tiny random replicas
(tools/tiny_detectors.py, tools/tiny_colpali.py, the NLI replica of tests/test_zero_shot.py) served by one real
worker. Each case asserts the exact status and reason, or the values.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2
from PIL import Image, ImageOps

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from test_zero_shot import GLICLASS_PROFILES, NLI_PROFILES
from tiny_colpali import build_tiny_colqwen2
from tiny_detectors import build_tiny_grounding_dino, build_tiny_owlv2
from tiny_families import build_tiny_gliclass, build_tiny_glirel, build_tiny_nli
from tiny_models import write_config
from worker_process import Services, inference_stub

NLI = "test/adv-nli"
GLICLASS = "test/adv-gliclass"
# The same weights reading the text before the labels (prompt_first: false, as gliclass-modern v3.0).
GLICLASS_TEXT_FIRST = "test/adv-gliclass-text-first"
GLIREL = "test/adv-glirel"
GROUNDING_DINO = "test/adv-grounding-dino"
OWLV2 = "test/adv-owlv2"
COLQWEN2 = "test/adv-colqwen2"
DETECT = "inputs: [image]\ntasks: [extract]\nprofiles:\n  default:\n    adapter: zero_shot_detector\n"
RETRIEVE = (
    "inputs: [text, image]\ntasks: [encode, score]\noutput_types: [multivector, dense]\nprofiles:\n  default:\n"
    "    adapter: colpali\n    run_options:\n      muvera: {k_sim: 2, d_proj: 4, repetitions: 3, seed: 5}\n"
)
LABELS = ["a cat", "dog"]
# The pixels one request may decode and resize, all its images together.
REQUEST_PIXELS = 1_000_000
WORKER_PID: list[int] = []


def png(size: tuple[int, int] = (40, 30), seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def glirel(directory: Path) -> Path:
    build_tiny_glirel(directory)
    return directory


def text_first(directory: Path) -> Path:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "prompt_first": False}))
    return directory


@pytest.fixture(scope="module")
def extraction_stub(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[inference_pb2_grpc.InferenceStub]:
    root = tmp_path_factory.mktemp("adv-extraction")
    configs = root / "configs"
    configs.mkdir()
    models: dict[str, tuple[Path, str]] = {
        NLI: (build_tiny_nli(root / "nli"), f"tasks: [extract]\n{NLI_PROFILES}"),
        GLICLASS: (build_tiny_gliclass(root / "gliclass"), f"tasks: [extract]\n{GLICLASS_PROFILES}"),
        GLICLASS_TEXT_FIRST: (
            text_first(build_tiny_gliclass(root / "gliclass-text-first")),
            "tasks: [extract]\nprofiles:\n  default:\n    adapter: gliclass\n",
        ),
        GLIREL: (glirel(root / "glirel"), "tasks: [extract]\nprofiles:\n  default:\n    adapter: glirel\n"),
        GROUNDING_DINO: (build_tiny_grounding_dino(root / "grounding-dino"), DETECT),
        OWLV2: (build_tiny_owlv2(root / "owlv2"), DETECT),
        COLQWEN2: (build_tiny_colqwen2(root / "colqwen2"), RETRIEVE),
    }
    for model_id, (directory, body) in models.items():
        write_config(configs, model_id, f"path: {directory}\n{body}")
    env = {
        "SIE_MODELS_DIR": str(configs),
        "SIE_PRELOAD_MODELS": "",
        "SIE_MAX_REQUEST_IMAGE_PIXELS": str(REQUEST_PIXELS),
    }
    worker = services.worker(env, name="extraction-worker")
    with inference_stub(worker) as stub:
        assert worker.pid is not None
        WORKER_PID.append(worker.pid)
        yield stub


def image_item(data: bytes) -> types_pb2.Item:
    return types_pb2.Item(images=[types_pb2.Image(data=data)])


def extract_request(
    model_id: str, items: list[types_pb2.Item], labels: list[str], threshold: float | None, options: dict[str, Any]
) -> inference_pb2.ExtractRequest:
    request = inference_pb2.ExtractRequest(model=model_id, items=items, labels=labels)
    if threshold is not None:
        request.threshold = threshold
    if options:
        struct = struct_pb2.Struct()
        struct.update(options)
        request.options.CopyFrom(struct)
    return request


def extract(
    stub: inference_pb2_grpc.InferenceStub,
    model_id: str,
    items: list[types_pb2.Item],
    labels: list[str] = LABELS,
    threshold: float | None = None,
    **options: Any,
) -> inference_pb2.ExtractResponse:
    request = extract_request(model_id, items, labels, threshold, options)
    return call_until_loaded(lambda: stub.Extract(request, timeout=60))[0]


@pytest.mark.parametrize(
    "model_id, threshold, options",
    [
        (GROUNDING_DINO, 1.0, {}),
        (GROUNDING_DINO, 0.999, {"text_threshold": 0.0}),
        (OWLV2, 1.0, {}),
    ],
    ids=["grounding-dino-1", "grounding-dino-0.999", "owlv2-1"],
)
def test_a_threshold_no_object_passes_finds_no_objects(extraction_stub, model_id, threshold, options) -> None:
    # GroundingDINO's post-processing decodes the labels of no object as one empty label: INTERNAL (a zip of
    # unequal lengths) before the fix.
    response = extract(extraction_stub, model_id, [image_item(png())], threshold=threshold, **options)
    assert [list(result.objects) for result in response.results] == [[]]


@pytest.mark.parametrize("profile", ["", "single"])
def test_gliclass_labels_past_the_models_length_are_refused(extraction_stub, profile) -> None:
    # The tiny GLiClass reads 128 tokens of "<<LABEL>>label ... <<SEP>>text": labels past them were cut from its
    # input and scored from a logit of 0 (0.5 multi-label, at the default threshold) without being read.
    labels = [f"label {index} " + "word " * 40 for index in range(4)]
    request = extract_request(GLICLASS, [types_pb2.Item(text="a short text")], labels, None, {})
    request.profile = profile
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: extraction_stub.Extract(request, timeout=60))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "LABELS_TOO_LONG"
    assert "the labels make a prompt of" in raised.value.details()
    assert extract(extraction_stub, GLICLASS, [types_pb2.Item(text="a short text")], labels[:1]).results[0].classifications


def test_gliclass_reading_the_text_first_reads_every_label_of_a_long_text(extraction_stub) -> None:
    # "text<<LABEL>>a<<LABEL>>b<<SEP>>" cut to the model's 128 tokens: the labels of a long text were cut off and
    # each scored 0.5 (a logit of 0), unread. Now the text is cut to leave them room.
    long = "the quarterly report on revenue and spending was published " * 30
    labels = ["sports", "economy"]
    response = extract(extraction_stub, GLICLASS_TEXT_FIRST, [types_pb2.Item(text=long)], labels, 0.0)
    scores = {found.label: found.score for found in response.results[0].classifications}
    assert sorted(scores) == sorted(labels) and all(score != 0.5 for score in scores.values()), scores


def test_glirel_keeps_the_best_relations_of_an_item(extraction_stub) -> None:
    # 60 one-word spans and 4 labels at threshold 0: every ordered pair and label is a relation (12,320 for a text of
    # 200 characters, 600 KB of answer per item, held for the whole request). Now the best max_relations (default
    # 100, at most 1,000).
    text = " ".join(f"w{index:02d}" for index in range(60))
    spans = [{"start": 4 * index, "end": 4 * index + 3, "label": "thing"} for index in range(60)]
    labels = ["a", "b", "c", "d"]
    item = [types_pb2.Item(text=text)]

    def relations(**options: Any) -> list[float]:
        response = extract(extraction_stub, GLIREL, item, labels, 0.0, entities=spans, **options)
        return [relation.score for relation in response.results[0].relations]

    default = relations()
    assert len(default) == 100 and default == sorted(default, reverse=True)
    assert relations(max_relations=5) == default[:5]
    assert len(relations(max_relations=1000)) == 1000
    request = extract_request(GLIREL, item, labels, 0.0, {"entities": spans, "max_relations": 1001})
    with pytest.raises(grpc.RpcError) as raised:
        extraction_stub.Extract(request, timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "INVALID_OPTIONS"
    assert "max_relations: must be a whole number from 1 to 1000" in raised.value.details()


@pytest.mark.parametrize(
    "model_id, items",
    [(GROUNDING_DINO, 120), (COLQWEN2, 1300)],
    ids=["grounding-dino-extract", "colqwen2-encode"],
)
def test_the_pixels_of_a_requests_images_are_bounded(extraction_stub, model_id, items) -> None:
    # A 1x1 PNG is 69 bytes, and the processor makes 96 x 96 float32 pixels of it for the tiny GroundingDINO (800 x
    # 800 for the real one: 7.7 MB): 8,192 of them in a 600 KB request would hold 63 GB at once, decoded and processed
    # before any forward pass. The sum over a request's images, from their headers, is bounded before decoding.
    tiny = png((1, 1))
    many = [image_item(tiny)] * items
    if model_id == GROUNDING_DINO:
        request: Any = extract_request(model_id, many, LABELS, None, {})
        call = extraction_stub.Extract
    else:
        request = inference_pb2.EncodeRequest(model=model_id, items=many, output_types=["multivector"])
        call = extraction_stub.Encode
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: call(request, timeout=60))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "REQUEST_IMAGES_TOO_LARGE"
    assert f"the limit is {REQUEST_PIXELS} (SIE_MAX_REQUEST_IMAGE_PIXELS)" in raised.value.details()
    del many[items // 2 :]
    if model_id == GROUNDING_DINO:
        assert len(extract(extraction_stub, model_id, many).results) == items // 2
    else:
        half = inference_pb2.EncodeRequest(model=model_id, items=many, output_types=["multivector"])
        assert len(call_until_loaded(lambda: extraction_stub.Encode(half, timeout=60))[0].results) == items // 2


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) / 1024


def test_nli_holds_the_pairs_of_a_batch_not_of_the_request(extraction_stub) -> None:
    # Every (text, hypothesis) pair of a request was tokenized before the first forward pass and held until it
    # answered: 200 texts x 128 labels are 25,600 pairs of up to 64 tokens as Python lists (about 85 MB here, for a
    # 130 KB request; 8,192 texts x 128 labels x 512 tokens of a real model are tens of GB). Now a batch's pairs are
    # tokenized when it runs.
    text = "the quarterly report on revenue and spending was published " * 10
    labels = [f"label number {index}" for index in range(128)]
    items = [types_pb2.Item(text=f"{text}{index}") for index in range(200)]
    extract(extraction_stub, NLI, items[:1], labels)
    pid = WORKER_PID[0]
    before, peak, done = resident_mb(pid), [0.0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], resident_mb(pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        response = extract(extraction_stub, NLI, items, labels)
    finally:
        done.set()
        watcher.join()
    assert len(response.results) == len(items)
    assert all(len(result.classifications) == len(labels) for result in response.results)
    print("NLI", before, peak[0])
    assert peak[0] - before < 40, (before, peak[0])


def oriented_png(image: Image.Image, orientation: int) -> bytes:
    """`image` as a PNG whose EXIF says how to turn it for display."""
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", exif=exif)
    return buffer.getvalue()


@pytest.mark.parametrize("orientation", [6, 8, 3])
def test_an_images_exif_orientation_is_applied(extraction_stub, orientation) -> None:
    # A phone photo is stored sideways with an EXIF orientation; transformers' own image loading (its pipelines'
    # load_image) turns it upright, as viewers do. The worker read the stored pixels: boxes in a frame the caller
    # never sees, a page embedded on its side. Now it is turned as transformers turns it.
    stored = Image.open(io.BytesIO(png((60, 100), seed=3)))
    sent = oriented_png(stored, orientation)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(sent)))
    assert upright.size != stored.size or orientation == 3
    buffer = io.BytesIO()
    upright.save(buffer, format="PNG")

    def pages(data: bytes) -> np.ndarray:
        request = inference_pb2.EncodeRequest(model=COLQWEN2, items=[image_item(data)], output_types=["multivector"])
        result = call_until_loaded(lambda: extraction_stub.Encode(request, timeout=60))[0].results[0]
        return from_tensor(result.multivector)

    np.testing.assert_allclose(pages(sent), pages(buffer.getvalue()), atol=1e-5)

    def boxes(data: bytes) -> list[list[float]]:
        found = extract(extraction_stub, OWLV2, [image_item(data)], threshold=0.0).results[0].objects
        return [[found.box.x_min, found.box.y_min, found.box.x_max, found.box.y_max] for found in found]

    np.testing.assert_allclose(boxes(sent), boxes(buffer.getvalue()), rtol=1e-4, atol=1e-3)
