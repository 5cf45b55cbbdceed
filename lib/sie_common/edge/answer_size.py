"""Answers larger than a message may be: refused with RESOURCE_EXHAUSTED naming the limit, never sent.

A message over grpc's send limit is not just refused: on a stream (the
gateway's Work stream to a worker, EncodeStream) it ends the whole stream, and
with it every other request in flight there. So an answer is measured before
it is sent, and where its size follows from the request and the model config
(items x dims x dtype), it is refused before any work.
"""

from __future__ import annotations

from google.protobuf.message import Message

from sie.v1 import inference_pb2
from sie_common.cluster.model_config import ModelConfig
from sie_common.edge.errors import ResourceExhausted

REASON = "RESPONSE_TOO_LARGE"
# The setting that bounds an answer's size on every server, named in RESPONSE_TOO_LARGE.
MAX_SEND_SETTING = "SIE_MAX_SEND_MESSAGE_BYTES"
# Room for what wraps an answer on a stream (WorkResponse, EncodeStreamResponse: ids, worker id).
ENVELOPE_BYTES = 1024
# Bits per value of each output dtype (binary ones are packed 8 to a byte).
DTYPE_BITS = {"float32": 32, "float16": 16, "int8": 8, "uint8": 8, "binary": 1, "ubinary": 1}


def too_large(size: int, limit: int, setting: str, *, estimated: bool) -> ResourceExhausted:
    what = "would take at least" if estimated else "takes"
    return ResourceExhausted(
        f"the answer {what} {size} bytes, more than the {limit} bytes a message may carry ({setting}); "
        f"send fewer items, fewer dims or a smaller output_dtype",
        reason=REASON,
        metadata={"limit": str(limit), "size": str(size)},
    )


def check_answer(answer: Message, limit: int, setting: str) -> None:
    """RESOURCE_EXHAUSTED/RESPONSE_TOO_LARGE when `answer`, once wrapped, would not fit in `limit` bytes."""
    size = answer.ByteSize()
    if size + ENVELOPE_BYTES > limit:
        raise too_large(size, limit, setting, estimated=False)


def check_encode_estimate(
    request: inference_pb2.EncodeRequest, config: ModelConfig, limit: int, setting: str, value_bytes: int | None = None
) -> None:
    """Refuse before any work an encode whose dense vectors alone would not fit in `limit` bytes, with the dims
    its request and model config state (`stated_dims`; the config states none: nothing to refuse yet).
    `value_bytes`: what one number takes when the answer spells its numbers out (JSON callers, OpenAI
    embeddings) instead of packing them in the output dtype."""
    if "dense" not in (request.output_types or config.default_output_types):
        return
    dims = stated_dims(request.dims if request.HasField("dims") else None, config.dims)
    check_dense_estimate(len(request.items), dims, request.output_dtype or "float32", limit, setting, value_bytes)


def stated_dims(request_dims: int | None, config_dims: int | None) -> int:
    """The dims an encode's answer has by its model config, before the model is loaded: the request's where it
    asks for fewer, else the config's (0: the config states none, nothing known yet). A request's own dims alone
    say nothing: more than the model has is refused once it is loaded, precisely (INVALID_ARGUMENT
    DIMS_TOO_LARGE), not as an answer too large. The gateway and the worker's plan refuse by this one rule."""
    return min(request_dims or config_dims, config_dims) if config_dims else 0


def check_dense_estimate(
    items: int, dims: int, dtype: str, limit: int, setting: str, value_bytes: int | None = None
) -> None:
    """RESOURCE_EXHAUSTED/RESPONSE_TOO_LARGE when `items` dense vectors of `dims` values alone exceed `limit` bytes.

    A lower bound on the answer (0 dims or an unknown dtype: nothing to refuse),
    so nothing that fits is refused; the answer itself is still measured with `check_answer`.
    """
    bits = value_bytes * 8 if value_bytes else DTYPE_BITS.get(dtype)
    if not dims or bits is None:
        return
    size = items * -(-dims * bits // 8)
    if size + ENVELOPE_BYTES > limit:
        raise too_large(size, limit, setting, estimated=True)
