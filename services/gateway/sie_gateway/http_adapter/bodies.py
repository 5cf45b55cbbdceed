"""Request bodies read within the bounds of docs/security.md, before any work: the size (from content-length, before
a byte is read), then msgpack or JSON with their nesting, container lengths, string and bin lengths and count of
values bounded; the reference SDK's numpy arrays numeric, flat and consistent; duplicate JSON keys refused.

A refusal is an AdapterError (400, or 413 for the size) naming what to change."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import msgpack
import numpy as np
from aiohttp import web

from sie_gateway.http_adapter.errors import AdapterError, invalid

# The numpy dtypes an array of the reference's msgpack-numpy encoding may have (its `type`, numpy's dtype.str):
# numbers and booleans, little- or big-endian. Objects (kind "O": pickle) and structured dtypes (kind "V") never.
NUMERIC_DTYPES = frozenset(
    f"{order}{kind}{size}" for order in "<>" for kind in "fiu" for size in (2, 4, 8) if not (kind == "f" and size == 1)
) | {"|b1", "|i1", "|u1"}
# The most dimensions such an array may have (the reference SDK's own limit).
MAX_ARRAY_DIMS = 8
JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"


@dataclass(frozen=True)
class BodyLimits:
    """The adapter's body bounds (HttpAdapterSettings)."""

    max_bytes: int
    max_depth: int
    max_container_len: int
    max_values: int
    read_timeout_s: float


# How long a request that finds no room in the budget (an HTTP body's next chunk, a gRPC message's read) waits for it
# before it drops stalled bodies to make it. Bodies and messages sent at once end within milliseconds and give their
# room back: a read that took room from a slow upload the moment it found none dropped it although nothing stayed held
# (one caller's 15 MiB upload at 5 MiB/s, with 2 small calls of its own at a time, was dropped about 1 s in, on each of
# 6 tries). HTTP bodies dropped stalled ones at once until they waited too (issue 32).
EVICT_AFTER_WAITING_S = 0.25
# How often a body's chunk waiting for room looks again.
ROOM_RECHECK_S = 0.01


class BodyBudget:
    """The body bytes all requests in flight may hold at once, and what one caller may hold of them.

    Each request's lease grows by the bytes of its body as they arrive (never by what it announces, so a sender that
    stalls holds only what it sent) and is returned when it is answered. A chunk that takes its caller (a bearer
    token, or a client address where no token is checked) past `caller_limit` refuses its request (503 OVERLOADED):
    one caller, however many connections it opens, leaves the rest of the budget to the others. A chunk that does not
    fit (its caller's share, or the whole budget) waits EVICT_AFTER_WAITING_S for room (bodies sent at once give theirs
    back sooner), then drops the bodies (that caller's, or anyone's) that have been arriving for `evict_after_s` or
    longer and are still not complete, oldest first, until it fits (each answered 408); only when none is left to drop
    is its own request refused (503 OVERLOADED). So bodies that stall part-sent
    cannot hold the budget against callers who send theirs at once; a body that has all arrived is never dropped."""

    def __init__(self, limit: int, caller_limit: int, evict_after_s: float) -> None:
        self.limit = limit
        self.caller_limit = caller_limit
        self.evict_after_s = evict_after_s
        self.held = 0
        self._callers: dict[str, int] = {}  # bytes held per caller that holds any
        # Leases whose bodies are arriving -> since when, and after how long they may be dropped; oldest first.
        self._reading: dict[BodyLease, tuple[float, float]] = {}

    @contextlib.contextmanager
    def lease(self, caller: str) -> Iterator[BodyLease]:
        """A lease for one request of `caller` (its bearer token, or its client's address without a token check)."""
        lease = BodyLease(self, caller)
        try:
            yield lease
        finally:
            self._release(lease)

    def held_by(self, caller: str) -> int:
        return self._callers.get(caller, 0)

    def take(self, lease: BodyLease, size: int, evict: bool = True) -> None:
        """Grow `lease` by `size` bytes, or refuse its request (AdapterError); `evict` False: without dropping stalled
        bodies to make the room."""
        if lease.evicted:
            raise _evicted(self.evict_after_s)
        if evict and self.held_by(lease.caller) + size > self.caller_limit:
            self._evict_stalled(lease, self.held_by(lease.caller) + size - self.caller_limit, lease.caller)
        if self.held_by(lease.caller) + size > self.caller_limit:
            raise _overloaded(
                f"the adapter holds as many bytes of this caller's request bodies as one caller may "
                f"({self.caller_limit} bytes, SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES): wait for answers "
                "before sending more; retry"
            )
        if evict and self.held + size > self.limit:
            self._evict_stalled(lease, self.held + size - self.limit)
        if self.held + size > self.limit:
            raise _overloaded(
                f"the adapter holds as many request bodies as it may ({self.limit} bytes, "
                "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES); retry"
            )
        self.held += size
        lease.size += size
        self._callers[lease.caller] = self.held_by(lease.caller) + size

    def shrink(self, lease: BodyLease, size: int) -> None:
        """Lower `lease` to `size` bytes (at most what it holds): it held room for a larger body than came."""
        freed = lease.size - min(size, lease.size)
        self.held -= freed
        lease.size -= freed
        left = self.held_by(lease.caller) - freed
        if left > 0:
            self._callers[lease.caller] = left
        else:
            self._callers.pop(lease.caller, None)

    @contextlib.contextmanager
    def arriving(self, lease: BodyLease, evict_after_s: float | None = None) -> Iterator[None]:
        """While `lease`'s body arrives (and so may be dropped, once it has been arriving for `evict_after_s`, by
        default the budget's evict_after_s)."""
        after = self.evict_after_s if evict_after_s is None else evict_after_s
        self._reading[lease] = (asyncio.get_running_loop().time(), after)
        try:
            yield
        finally:
            self._reading.pop(lease, None)

    def _evict_stalled(self, taker: BodyLease, needed: int, caller: str | None = None) -> None:
        """Drop bodies arriving for their evict time or longer (of `caller` only, when given), oldest first, until
        `needed` bytes are free."""
        loop = asyncio.get_running_loop()
        for lease, (since, after) in list(self._reading.items()):
            if needed <= 0:
                return
            if loop.time() - since < after or lease is taker or lease.size == 0 or caller not in (None, lease.caller):
                continue
            needed -= lease.size
            self._release(lease)
            lease.evict(loop.time())

    def _release(self, lease: BodyLease) -> None:
        self._reading.pop(lease, None)
        self.shrink(lease, 0)


class BodyLease:
    """One request's share of the BodyBudget."""

    def __init__(self, budget: BodyBudget, caller: str) -> None:
        self.budget = budget
        self.caller = caller
        self.size = 0
        self.evicted = False
        self._deadline: asyncio.Timeout | None = None

    @contextlib.contextmanager
    def reading(self, deadline: asyncio.Timeout, evict_after_s: float | None = None) -> Iterator[None]:
        """While the body arrives under `deadline`, which an eviction brings to now (BodyBudget.arriving)."""
        self._deadline = deadline
        try:
            with self.budget.arriving(self, evict_after_s):
                yield
        finally:
            self._deadline = None

    def grow(self, size: int, evict: bool = True) -> None:
        self.budget.take(self, size, evict)

    async def grow_when_room(self, size: int) -> None:
        """Grow by `size` bytes once they fit, looking again for EVICT_AFTER_WAITING_S before dropping stalled bodies
        to make the room (BodyBudget.take); refused (AdapterError) if even that does not."""
        loop = asyncio.get_running_loop()
        waited = loop.time() + EVICT_AFTER_WAITING_S
        while loop.time() < waited:
            try:
                self.grow(size, evict=False)
                return
            except AdapterError:
                if self.evicted:
                    raise
            await asyncio.sleep(ROOM_RECHECK_S)
        self.grow(size)

    def evict(self, now: float) -> None:
        self.evicted = True
        if self._deadline is not None:
            self._deadline.reschedule(now)


def _overloaded(message: str) -> AdapterError:
    return AdapterError(503, "OVERLOADED", message, retry_after_s=1.0, code=grpc.StatusCode.UNAVAILABLE)


def _evicted(evict_after_s: float) -> AdapterError:
    return AdapterError(
        408,
        "REQUEST_TIMEOUT",
        f"the body was still arriving {evict_after_s:g} s after it began (SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S) when "
        "the adapter's body budget was full: it was dropped to make room for bodies sent at once. Send the body "
        "without pausing, or retry",
        retry_after_s=1.0,
        code=grpc.StatusCode.DEADLINE_EXCEEDED,
    )


async def read_body(request: web.Request, limits: BodyLimits, lease: BodyLease) -> bytearray:
    """The whole body: 413 from its content-length before reading, or once more than the limit has come; each chunk
    leased as it arrives; 408 unless it has all come within limits.read_timeout_s, or when the budget dropped it."""
    announced = request.content_length
    if announced is not None and announced > limits.max_bytes:
        raise _too_large(announced, limits)
    body = bytearray()
    try:
        async with asyncio.timeout(limits.read_timeout_s) as deadline:
            with lease.reading(deadline):
                async for chunk in request.content.iter_any():
                    if len(body) + len(chunk) > limits.max_bytes:
                        raise _too_large(None, limits)
                    await lease.grow_when_room(len(chunk))
                    body += chunk
    except TimeoutError:
        if lease.evicted:
            raise _evicted(lease.budget.evict_after_s) from None
        raise AdapterError(
            408,
            "REQUEST_TIMEOUT",
            f"the body did not arrive within {limits.read_timeout_s:g} s (SIE_GATEWAY_HTTP_BODY_TIMEOUT_S): send it "
            "at once, or send less",
            code=grpc.StatusCode.DEADLINE_EXCEEDED,
        ) from None
    return body


def refuse_content_encoding(request: web.Request) -> None:
    """415 for a body sent compressed (any Content-Encoding but identity), before it is read: the adapter reads
    bodies as they are sent (its server never inflates them), so a small compressed body cannot become a large one
    past the body limits."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AdapterError(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            f"Content-Encoding {encoding[:32]!r} is refused: send the body uncompressed",
            field="content-encoding",
        )


def require_content_type(request: web.Request, expected: str) -> None:
    """415 unless the body is sent as `expected` (its parameters, e.g. charset, aside)."""
    if request.content_type != expected:
        raise AdapterError(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            f"the body must be sent as {expected} (Content-Type: {expected}), not {request.content_type[:64]}",
        )


def _too_large(size: int | None, limits: BodyLimits) -> AdapterError:
    has = f"has {size} bytes" if size is not None else "is larger than that"
    return AdapterError(
        413,
        "BODY_TOO_LARGE",
        f"the body {has}; the limit is {limits.max_bytes} bytes (SIE_GATEWAY_HTTP_MAX_BODY_BYTES): send fewer or "
        "smaller items per request",
    )


class _Counter:
    """Counts the values of a body as its containers close, and refuses past the limit (so a body of many small
    values is refused before it has all been built)."""

    def __init__(self, limits: BodyLimits) -> None:
        self.left = limits.max_values
        self.limits = limits

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise invalid(
                f"the body holds more than {self.limits.max_values} values (SIE_GATEWAY_HTTP_MAX_VALUES)",
                reason="TOO_MANY_VALUES",
            )


def msgpack_body(data: bytes | bytearray, limits: BodyLimits) -> dict[str, Any]:
    """A msgpack map, with each msgpack-numpy array (the reference SDK's encoding) as a numpy array."""
    counter = _Counter(limits)

    def pairs(entries: list[tuple[Any, Any]]) -> Any:
        counter.take(2 * len(entries) + 1)
        if not all(isinstance(key, str | bytes) for key, _ in entries):
            raise invalid("a map key of the body is not a string", reason="INVALID_MSGPACK")
        mapping = dict(entries)
        if len(mapping) != len(entries):
            raise invalid("a map of the body gives a key twice; give each once", reason="DUPLICATE_FIELD")
        return _numpy_array(mapping) if b"nd" in mapping else mapping

    def array(values: list[Any]) -> list[Any]:
        counter.take(len(values) + 1)
        return values

    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=False,  # bytes keys: the msgpack-numpy encoding's
        object_pairs_hook=pairs,
        list_hook=array,
        max_buffer_size=len(data) + 1,
        max_str_len=limits.max_bytes,
        max_bin_len=limits.max_bytes,
        max_array_len=limits.max_container_len,
        max_map_len=limits.max_container_len,
        max_ext_len=0,
    )
    unpacker.feed(data)
    try:
        body = _one_value(unpacker)
    except (ValueError, RecursionError) as error:  # msgpack's FormatError and StackError are ValueErrors
        raise invalid(
            f"the body is not one msgpack map within the limits: {type(error).__name__}: {str(error)[:200]}",
            reason="INVALID_MSGPACK",
        ) from None
    if not isinstance(body, dict):
        raise invalid(f"the body must be a msgpack map, not {kind_of(body)}", reason="INVALID_MSGPACK")
    _check_depth(body, limits.max_depth)
    return body


def _one_value(unpacker: msgpack.Unpacker) -> Any:
    try:
        value = unpacker.unpack()
    except msgpack.OutOfData:
        raise invalid("the body ends inside a msgpack value", reason="INVALID_MSGPACK") from None
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        return value
    raise invalid("the body holds more than one msgpack value", reason="INVALID_MSGPACK")


def _numpy_array(value: dict[Any, Any]) -> np.ndarray | np.generic:
    """A msgpack-numpy array or scalar ({nd, type, kind, shape, data}, bytes or str keys): numeric, flat, its shape
    matching its data; anything else is refused (kind "O" would unpickle, kind "V" is a structured dtype)."""
    fields = {key.decode() if isinstance(key, bytes) else key: item for key, item in value.items()}
    if set(fields) - {"nd", "type", "kind", "shape", "data"}:
        raise invalid("a numpy array has fields other than nd, type, kind, shape, data", reason="INVALID_ARRAY")
    is_array, dtype_name, kind = fields.get("nd"), fields.get("type"), fields.get("kind", b"")
    if not isinstance(is_array, bool):
        raise invalid("a numpy array's `nd` must be true or false", reason="INVALID_ARRAY")
    if kind not in (b"", ""):
        raise invalid(
            "object and structured numpy arrays are refused: only numeric dtypes travel", reason="ARRAY_DTYPE_REFUSED"
        )
    if isinstance(dtype_name, bytes):
        dtype_name = dtype_name.decode("ascii", "replace")
    if not isinstance(dtype_name, str) or dtype_name not in NUMERIC_DTYPES:
        raise invalid(
            f"numpy dtype {str(dtype_name)[:32]!r} is refused: only numeric dtypes travel "
            f"({', '.join(sorted(NUMERIC_DTYPES))})",
            reason="ARRAY_DTYPE_REFUSED",
        )
    dtype = np.dtype(dtype_name)
    data = fields.get("data")
    if not isinstance(data, bytes):
        raise invalid("a numpy array's `data` must be bytes", reason="INVALID_ARRAY")
    if not is_array:
        if len(data) != dtype.itemsize:
            raise invalid("a numpy scalar's data does not match its dtype's size", reason="ARRAY_SHAPE_MISMATCH")
        return np.frombuffer(data, dtype=dtype, count=1)[0]
    shape = fields.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_ARRAY_DIMS:
        raise invalid(f"a numpy array's shape must be a list of at most {MAX_ARRAY_DIMS} sizes", reason="INVALID_ARRAY")
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape):
        raise invalid("a numpy array's sizes must be whole numbers >= 0", reason="INVALID_ARRAY")
    if math.prod(shape) * dtype.itemsize != len(data):
        raise invalid(
            f"a numpy array of shape {shape} and dtype {dtype_name} takes {math.prod(shape) * dtype.itemsize} bytes, "
            f"its data has {len(data)}",
            reason="ARRAY_SHAPE_MISMATCH",
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def json_body(data: bytes | bytearray, limits: BodyLimits) -> Any:
    """One strict JSON value (RFC 8259: no NaN or Infinity, no duplicate keys), within the limits."""
    counter = _Counter(limits)

    def pairs(entries: list[tuple[str, Any]]) -> dict[str, Any]:
        if len(entries) > limits.max_container_len:
            raise _container(limits)
        counter.take(2 * len(entries) + 1)
        mapping = dict(entries)
        if len(mapping) != len(entries):
            seen: set[str] = set()
            twice = next(key for key, _ in entries if key in seen or seen.add(key))  # type: ignore[func-returns-value]
            raise invalid(
                f"key {twice[:64]!r} is given twice; give it once", reason="DUPLICATE_FIELD", field=twice[:64]
            )
        return mapping

    def constant(name: str) -> Any:
        raise invalid(f"{name} is not JSON (RFC 8259)", reason="INVALID_JSON")

    _scan_json(data, limits)
    try:
        text = data.decode("utf-8")
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except UnicodeDecodeError as error:
        raise invalid(f"the body is not UTF-8 at byte {error.start}", reason="INVALID_JSON") from None
    except RecursionError:
        raise invalid(f"the body nests deeper than {limits.max_depth} levels", reason="TOO_DEEP") from None
    except json.JSONDecodeError as error:
        raise invalid(f"the body is not JSON at byte {error.pos}: {error.msg}", reason="INVALID_JSON") from None
    except ValueError as error:  # a number of more digits than Python converts (sys.get_int_max_str_digits)
        raise invalid(f"the body has a number too long to read: {str(error)[:120]}", reason="INVALID_JSON") from None
    _check_depth(value, limits.max_depth, counter, limits)
    return value


# Bytes of a JSON body scanned at a time (the scan's arrays are a few times this, never the body's size).
SCAN_BLOCK = 256 * 1024
QUOTE, BACKSLASH = ord('"'), ord("\\")


def _scan_json(data: bytes | bytearray, limits: BodyLimits) -> None:
    """Refuse a body of more than limits.max_values values, or nested deeper than limits.max_depth, before
    json.loads builds any of it: one linear pass (numpy, a block at a time) over the structural bytes outside
    strings. A value count of containers plus separators (`,` and `:`) is at most the body's true count, so no body
    within the limits is refused here; json_body counts exactly once it is parsed."""
    view = np.frombuffer(data, dtype=np.uint8)
    in_string, backslashes, depth, values = 0, 0, 0, 0
    for start in range(0, len(view), SCAN_BLOCK):
        block = view[start : start + SCAN_BLOCK]
        quotes = block == QUOTE
        is_backslash = block == BACKSLASH
        if backslashes or is_backslash.any():
            # The run of backslashes each byte ends (a quote after an odd run is escaped), the last block's carried.
            positions = np.arange(len(block), dtype=np.int32)
            last_other = np.where(is_backslash, np.int32(-1), positions)
            np.maximum.accumulate(last_other, out=last_other)
            runs = positions - last_other + np.where(last_other < 0, backslashes, 0)
            quotes[0] &= backslashes % 2 == 0
            quotes[1:] &= runs[:-1] % 2 == 0
            backslashes = int(runs[-1]) if is_backslash[-1] else 0
        outside = (np.bitwise_xor.accumulate(quotes.view(np.uint8)) ^ in_string) == 0
        in_string = int(not outside[-1])
        opens = ((block == ord("[")) | (block == ord("{"))) & outside
        closes = ((block == ord("]")) | (block == ord("}"))) & outside
        separators = ((block == ord(",")) | (block == ord(":"))) & outside
        values += int(np.count_nonzero(opens)) + int(np.count_nonzero(separators))
        if values > limits.max_values:
            raise invalid(
                f"the body holds more than {limits.max_values} values (SIE_GATEWAY_HTTP_MAX_VALUES)",
                reason="TOO_MANY_VALUES",
            )
        levels = np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int32)
        if depth + int(levels.max()) > limits.max_depth:
            raise invalid(
                f"the body nests deeper than {limits.max_depth} levels (SIE_GATEWAY_HTTP_MAX_DEPTH)", reason="TOO_DEEP"
            )
        depth += int(levels[-1])


def _check_depth(value: Any, limit: int, counter: _Counter | None = None, limits: BodyLimits | None = None) -> None:
    """Refuse nesting deeper than `limit`; with `counter` (JSON), count the values of arrays (JSON has no hook for
    them), refuse arrays longer than the container limit and strings that are not Unicode text (a lone surrogate,
    which JSON's \\u escapes can write and no protobuf string may hold)."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, str):
            if counter is not None:
                _check_text(node)
            continue
        if isinstance(node, dict):
            if counter is not None:
                for key in node:
                    _check_text(key)
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
            if counter is not None and limits is not None:
                if len(node) > limits.max_container_len:
                    raise _container(limits)
                counter.take(len(node) + 1)
        else:
            continue
        if depth > limit:
            raise invalid(f"the body nests deeper than {limit} levels (SIE_GATEWAY_HTTP_MAX_DEPTH)", reason="TOO_DEEP")
        pending.extend((child, depth + 1) for child in children)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise invalid(
                f"a string of the body holds a lone surrogate (\\u{ord(text[error.start]):04x}): JSON strings must be "
                "Unicode text",
                reason="INVALID_JSON",
            ) from None


def _container(limits: BodyLimits) -> AdapterError:
    return invalid(
        f"a map or array of the body has more than {limits.max_container_len} entries "
        "(SIE_GATEWAY_HTTP_MAX_CONTAINER_LEN)",
        reason="CONTAINER_TOO_LONG",
    )


def kind_of(value: Any) -> str:
    """A value's JSON / msgpack type, for messages."""
    return {
        dict: "a map",
        list: "an array",
        str: "a string",
        bytes: "bytes",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)
