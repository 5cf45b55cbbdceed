"""What callers pass in and get back: plain dicts (TypedDicts) of numpy arrays, with the reference SDK's names and
keys. Where this engine says more, a result has extra keys; a reference key is never renamed or given another type.

`Item(text="hello")` builds a dict ({"text": "hello"}), as the reference's Item does, so `item["text"]`,
`item.get("id")` and `json.dumps(item)` work on it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NotRequired, Required, TypedDict, cast

import numpy as np

from sie_contract.tensors import dequantize_rows

if TYPE_CHECKING:
    from PIL import Image

# Output dtypes a request may name (bfloat16 is a compute precision, never returned).
DType = Literal["float32", "float16", "bfloat16", "int8", "uint8", "binary", "ubinary"]
OutputDType = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]
DEFAULT_OUTPUT_DTYPE: OutputDType = "float32"
OutputType = Literal["dense", "sparse", "multivector"]
# A model's lifecycle state, as list_models() and get_model() report it.
ModelState = Literal["available", "loading", "loaded", "unloading", "failed"]


def np_to_dtype(arr: np.ndarray) -> DType:
    """The output dtype name of a numpy array (float32 for any other dtype)."""
    names: dict[Any, DType] = {np.float32: "float32", np.float16: "float16", np.int8: "int8", np.uint8: "uint8"}
    return names.get(arr.dtype.type, "float32")


# --- inputs ----------------------------------------------------------------------------------------------------


class ImageInput(TypedDict, total=False):
    """An image with a format hint: `data` is encoded bytes, a file path, a PIL image or a uint8 array."""

    data: Required[Image.Image | np.ndarray | bytes | str | os.PathLike[str]]
    format: str


class AudioInput(TypedDict, total=False):
    """The reference's audio input; this engine takes no audio (an item with `audio` is an ItemError)."""

    data: bytes | np.ndarray | str | os.PathLike[str]
    format: str
    sample_rate: int


class VideoInput(TypedDict, total=False):
    """The reference's video input; this engine takes no video (an item with `video` is an ItemError)."""

    data: bytes | str | os.PathLike[str]
    format: str


class DocumentInput(TypedDict, total=False):
    """The reference's document input; this engine takes no documents (an item with `document` is an ItemError)."""

    data: bytes | str | os.PathLike[str]
    format: str


class Item(TypedDict, total=False):
    """One input. `id` is echoed back on its result. `images` (for image models) are ImageInputs, encoded bytes
    (JPEG, PNG, WebP), file paths, PIL images or uint8 numpy arrays; the client sends each as encoded bytes (see
    sie_client.images). The reference's `audio`, `video`, `document` and `multivector` keys exist for its other
    models; this engine refuses them (ItemError), as it does any key not listed here."""

    id: str
    text: str
    images: Sequence[ImageInput | Image.Image | np.ndarray | bytes | str | os.PathLike[str]]
    audio: AudioInput | bytes | str | os.PathLike[str]
    video: VideoInput | bytes | str | os.PathLike[str]
    document: DocumentInput | bytes | str | os.PathLike[str]
    metadata: dict[str, Any]
    multivector: np.ndarray


# --- encode ----------------------------------------------------------------------------------------------------


class SparseResult(TypedDict):
    """A sparse vector: token ids (int32) and their weights (float32)."""

    indices: np.ndarray
    values: np.ndarray


class TimingInfo(TypedDict, total=False):
    """The server's timing of a request, in milliseconds."""

    total_ms: float
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    # Ours: pooling, truncation, quantization and packing.
    postprocessing_ms: float
    # Ours, with debug=True: the forward passes that carried the request (see docs/batching.md).
    batches: list[dict[str, Any]]


# Our earlier name of TimingInfo.
Timing = TimingInfo


class EncodeResult(TypedDict, total=False):
    model: str
    # The item's id; `item-<index>` for an item sent without one (as score names it).
    id: str
    dense: np.ndarray
    sparse: SparseResult
    multivector: np.ndarray
    timing: TimingInfo
    # Ours, for int8 / uint8 outputs: per-row decode parameters, float = q * scale + offset (see dequantize).
    dense_scale: np.ndarray
    dense_offset: np.ndarray
    multivector_scale: np.ndarray
    multivector_offset: np.ndarray


def dequantize(result: EncodeResult, output: str = "dense") -> np.ndarray:
    """An int8 / uint8 output decoded to float32 (other dtypes come back as float32 unchanged)."""
    fields = cast(Mapping[str, Any], result)  # keys chosen at run time
    values = np.asarray(fields[output])
    scale = fields.get(f"{output}_scale")
    if scale is None:
        return values.astype(np.float32)
    return dequantize_rows(values, scale, fields.get(f"{output}_offset"))


# --- score -----------------------------------------------------------------------------------------------------


class ScoreEntry(TypedDict):
    # The item's id, or `item-<index>` for an item sent without one.
    item_id: str
    score: float
    # 0 for the most relevant.
    rank: int
    # Ours: the item's position in the request.
    index: NotRequired[int]


class ScoreInputTokensDetails(TypedDict):
    content_tokens: Required[int]


class ScoreUsage(TypedDict):
    input_tokens: Required[int]
    images: NotRequired[int]
    input_tokens_details: NotRequired[ScoreInputTokensDetails]


class ScoreResult(TypedDict, total=False):
    model: str
    # The query item's id (None when it had none).
    query_id: str | None
    # Best first.
    scores: list[ScoreEntry]
    usage: ScoreUsage
    # Ours.
    timing: TimingInfo


# --- extract ---------------------------------------------------------------------------------------------------


class Entity(TypedDict, total=False):
    text: str
    label: str
    score: float
    # Character offsets in the item's text.
    start: int | None
    end: int | None
    # [x, y, width, height] in pixels, for an entity found in an image; None for text.
    bbox: list[int] | None


class Relation(TypedDict):
    # The head and tail entities' texts, and the relation between them.
    head: str
    tail: str
    relation: str
    score: float
    # Ours: the head and tail entities with their offsets.
    head_entity: NotRequired[Entity]
    tail_entity: NotRequired[Entity]


class Classification(TypedDict):
    label: str
    score: float


class Box(TypedDict):
    """Corners in pixels of the original image, origin at its top-left corner, as the server reports them."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float


class DetectedObject(TypedDict):
    label: str
    score: float
    # [x, y, width, height] in whole pixels: the top-left corner and the size.
    bbox: list[int]
    # Ours: the exact corners.
    box: NotRequired[Box]


class ExtractItemErrorDetail(TypedDict):
    code: str
    message: str


class ExtractResult(TypedDict, total=False):
    model: str
    # The item's id; `item-<index>` for an item sent without one.
    id: str
    entities: list[Entity]
    relations: list[Relation]
    classifications: list[Classification]
    objects: list[DetectedObject]
    # What a document model generated ({"text": ...} or a JSON object); {} for other models.
    data: dict[str, Any]
    error: ExtractItemErrorDetail
    # Ours.
    timing: TimingInfo


# The reference's earlier names.
EntityResult = Entity
RelationResult = Relation
ClassificationResult = Classification
ObjectResult = DetectedObject


# --- models ----------------------------------------------------------------------------------------------------


class ModelDims(TypedDict, total=False):
    """The width of each output the server reports (this engine reports the dense width only)."""

    dense: int
    sparse: int
    multivector: int


class ModelCapabilities(TypedDict, total=False):
    """Generation capabilities: this engine generates nothing, so ModelInfo.capabilities is None."""

    streaming: bool | None
    grammar: list[str]
    tools: bool
    lora_adapters: list[str]
    profile_lora_adapters: dict[str, list[str]]
    code: bool
    sql: bool
    guard: bool


class ProfileInfo(TypedDict, total=False):
    # The profile a request without `@profile` (or `profile=`) gets.
    is_default: bool
    identity: str | None
    remote_contract_sha256: str | None
    remote_execution_sha256: str | None
    runtime_instance_id: str | None


class ModelLoadError(TypedDict, total=False):
    """Why the last load failed (ModelInfo.last_error)."""

    # "UNKNOWN": the server reports the failure's message, not a class.
    code: str
    message: str
    attempts: int
    # True when the server will not try again by itself.
    permanent: bool


class ModelRouting(TypedDict):
    # None: served by this engine's own workers (there are no remote upstreams).
    policy: Literal["remote_only", "fallback", "threshold"] | None
    upstream_kind: Literal["sie", "openai"] | None


class ModelInfo(TypedDict, total=False):
    """A model as list_models() and get_model() describe it. Ours adds the server's own fields under their names
    (id, tasks, output_types, loras, loaded_loras, loaded_on, memory_bytes, stats, rollouts, failure)."""

    name: str
    # In memory (on a gateway: on at least one worker).
    loaded: bool
    state: ModelState
    last_error: ModelLoadError | None
    inputs: list[str]
    outputs: list[str]
    dims: ModelDims
    max_sequence_length: int | None
    revision: str | None
    # By name; address one as "model@profile" (or profile=).
    profiles: dict[str, ProfileInfo]
    capabilities: ModelCapabilities | None
    routing: ModelRouting
    aliases: list[str]


# --- pools and capacity ----------------------------------------------------------------------------------------


class PoolSpec(TypedDict, total=False):
    """A pool to create (SIEClient(pool=...), create_pool's arguments)."""

    name: Required[str]
    queue_pool: str
    gpus: dict[str, int]
    gpu_caps: dict[str, int]
    bundle: str
    minimum_worker_count: int
    pinned_models: list[str]


class AssignedWorkerInfo(TypedDict):
    name: str
    # This engine's API reports a worker's id only: url, gpu and bundle are "".
    url: str
    gpu: str
    bundle: str


class PoolStatusInfo(TypedDict, total=False):
    # "active" once every requested worker is assigned, else "pending".
    state: str
    assigned_workers: list[AssignedWorkerInfo]
    created_at: float
    last_renewed: float


class PoolSpecResponse(TypedDict, total=False):
    name: str
    queue_pool: str
    gpus: dict[str, int]
    gpu_caps: dict[str, int]
    bundle: str | None
    minimum_worker_count: int
    pinned_models: list[str]


class PoolInfo(TypedDict, total=False):
    """A pool: the reference's nested `spec` and `status`; ours adds the server's fields (gpus, workers, ready,
    bundle, ttl_s, expires_at) at the top level."""

    name: str
    spec: PoolSpecResponse
    status: PoolStatusInfo


PoolResponse = PoolInfo


class WorkerInfo(TypedDict, total=False):
    """A worker as get_capacity() sees it: this engine's API reports each worker's id, bundle and loaded models;
    the fields it has no source for keep their empty values (gpu "", counts 0)."""

    name: str
    url: str
    gpu: str
    gpu_count: int
    ready_gpu_slots: int
    healthy: bool
    queue_depth: int
    pending_cost: int
    inflight_batches: int
    loaded_models: list[str]
    memory_used_bytes: int
    memory_total_bytes: int
    bundle: NotRequired[str]
    bundle_config_hash: str


class CapacityInfo(TypedDict, total=False):
    # "healthy" with workers, "no_workers" without.
    status: str
    worker_count: int
    gpu_count: int
    models_loaded: int
    configured_gpu_types: list[str]
    live_gpu_types: list[str]
    workers: list[WorkerInfo]
    # Ours: per model {loaded, loaded_on, state}, and the pools.
    models: dict[str, dict[str, Any]]
    pools: list[PoolInfo]
