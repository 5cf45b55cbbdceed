"""JSON answers of the adapter, written by orjson straight from numpy arrays (no Python float per value: a vector
answer costs about its JSON text, not tens of bytes per number), and an array answer streamed element by element,
so an answer of many vectors is never whole in memory as JSON and the gateway's event loop serves other calls
between its parts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from sie_gateway.http_adapter.bodies import JSON_TYPE

# Bytes of JSON gathered before each write (and each turn given back to the event loop).
CHUNK_BYTES = 256 * 1024


def dumps(value: Any) -> bytes:
    """`value` as JSON; numpy arrays and scalars as numbers (float32 at float32's shortest form, as TEI writes)."""
    return orjson.dumps(value, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY)


def _plain(value: Any) -> Any:
    """What orjson does not write itself: numpy arrays it refuses (not contiguous, other dtypes) as lists."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


async def json_array(request: web.Request, elements: Iterable[Any]) -> web.StreamResponse:
    """A 200 answer `[element, ...]`, each element written as dumps writes it, in chunks of about CHUNK_BYTES."""
    response = web.StreamResponse(headers={"Content-Type": JSON_TYPE})
    await response.prepare(request)
    chunk = bytearray(b"[")
    for index, element in enumerate(elements):
        if index:
            chunk += b","
        chunk += dumps(element)
        if len(chunk) >= CHUNK_BYTES:
            await response.write(bytes(chunk))
            chunk.clear()
            await asyncio.sleep(0)
    chunk += b"]"
    await response.write_eof(bytes(chunk))
    return response
