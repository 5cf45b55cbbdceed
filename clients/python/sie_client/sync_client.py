"""SIEClient: the blocking twin of AsyncSIEClient.

It runs an AsyncSIEClient on a private event-loop thread, so both clients
share one implementation: same methods, same arguments, same results.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, Literal, NoReturn, ParamSpec, TypeVar, Unpack, overload

from sie_client.async_client import AsyncSIEClient
from sie_client.connection import Connection
from sie_client.messages import ItemLike
from sie_client.types import EncodeResult, ExtractResult
from sie_client.verbs import EncodeOptions, ExtractOptions

CLOSED_IN_FLIGHT = "this SIEClient was closed while the call was in flight"
P = ParamSpec("P")
R = TypeVar("R")


def _blocking(
    method: Callable[Concatenate[AsyncSIEClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[SIEClient, P], R]:
    @functools.wraps(method)
    def call(self: SIEClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(method(self._client, *args, **kwargs))

    return call


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def _shutdown(loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: AsyncSIEClient) -> None:
    """Close the client and end its thread: on close(), or when the SIEClient is dropped without it."""
    if threading.current_thread() is thread:  # dropped on its own loop: it cannot wait for itself
        loop.call_soon(loop.stop)
        return
    asyncio.run_coroutine_threadsafe(_close(client), loop).result()
    _stop(loop, thread)


async def _close(client: AsyncSIEClient) -> None:
    """On the client's loop: cancel the calls still running there, then close the channel. A call left running on a
    loop that stops would never answer, and its caller (blocking, or awaiting run_async) would wait forever."""
    running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    await client.close()


class SIEClient:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Same arguments as AsyncSIEClient (its signature is this one's: see the end of this module)."""
        self._arguments = (args, kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sie-client", daemon=True)
        self._thread.start()
        try:
            self._client: AsyncSIEClient = self._run(self._create(args, kwargs))
        except BaseException:
            _stop(self._loop, self._thread)
            raise
        # Framework integrations hold a client and have no close() in their protocols: one dropped without close()
        # must not keep its thread, event loop and channel (and renew its pools) for the life of the process.
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._thread, self._client)

    def __reduce__(self) -> tuple[Callable[[], SIEClient], tuple[()]]:
        """A pickled client unpickles as a new client with the same arguments, which connects in its own process: what
        a framework's process pool (LlamaIndex's IngestionPipeline with num_workers, ...) needs of the objects that
        hold one. Its connection and its pools' leases stay with the original."""
        args, kwargs = self._arguments
        return functools.partial(SIEClient, *args, **kwargs), ()

    @staticmethod
    async def _create(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncSIEClient:
        """On the client's loop: what the async client creates there (its channel, locks) belongs to that loop."""
        return AsyncSIEClient(*args, **kwargs)

    @property
    def base_url(self) -> str:
        return self._client.base_url

    @property
    def target(self) -> str:
        return self._client.target

    def _run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        try:
            return self._submit(coroutine).result()
        except concurrent.futures.CancelledError:  # only close() cancels a blocking caller's call
            raise RuntimeError(CLOSED_IN_FLIGHT) from None

    def _submit(self, coroutine: Coroutine[Any, Any, R]) -> concurrent.futures.Future[R]:
        """`coroutine` scheduled on the client's loop; a RuntimeError that says so once the client is closed."""
        if self._loop.is_closed():
            coroutine.close()  # never run: no "never awaited" warning on top of the error
            raise RuntimeError("this SIEClient is closed; make a new one")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def run_async(self, call: Callable[[AsyncSIEClient], Coroutine[Any, Any, R]]) -> R:
        """Await `call(client)`, a coroutine of the AsyncSIEClient inside, from any event loop: it runs on this
        client's own loop and channel while the caller's loop carries on. So one SIEClient serves blocking and async
        callers over one connection whatever loop they run on (a grpc.aio channel belongs to the loop that made it):
        `await client.run_async(lambda c: c.encode(model, texts))`."""
        try:
            return await asyncio.wrap_future(self._submit(call(self._client)))
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling():  # the caller's own cancellation goes on as one
                raise
            raise RuntimeError(CLOSED_IN_FLIGHT) from None

    def __enter__(self) -> SIEClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._finalizer()  # once: later calls do nothing

    # encode and extract spelled out, with the async methods' documentation: a wrapper would keep only the first of
    # their overloads. The implementations take `items: Any`, as the overloads type them (a union would make mypy
    # join the two answers).
    @overload  # a str is also a Sequence: one str is one item, as the first overload says
    def encode(self, model: str, items: ItemLike, **options: Unpack[EncodeOptions]) -> EncodeResult: ...  # type: ignore[overload-overlap]
    @overload
    def encode(self, model: str, items: Sequence[ItemLike], **options: Unpack[EncodeOptions]) -> list[EncodeResult]: ...
    def encode(self, model: str, items: Any, **options: Unpack[EncodeOptions]) -> EncodeResult | list[EncodeResult]:
        return self._run(self._client.encode(model, items, **options))

    functools.update_wrapper(encode, AsyncSIEClient.encode)  # its documentation and signature

    @overload  # a str is also a Sequence: one str is one item, as the first overload says
    def extract(self, model: str, items: ItemLike, **options: Unpack[ExtractOptions]) -> ExtractResult: ...  # type: ignore[overload-overlap]
    @overload
    def extract(
        self, model: str, items: Sequence[ItemLike], **options: Unpack[ExtractOptions]
    ) -> list[ExtractResult]: ...
    def extract(self, model: str, items: Any, **options: Unpack[ExtractOptions]) -> ExtractResult | list[ExtractResult]:
        return self._run(self._client.extract(model, items, **options))

    functools.update_wrapper(extract, AsyncSIEClient.extract)

    def watch(self, *, mode: Literal["auto", "cluster", "worker"] = "auto") -> NoReturn:
        self._client.watch(mode=mode)

    watch.__doc__ = AsyncSIEClient.watch.__doc__

    score = _blocking(AsyncSIEClient.score)
    list_models = _blocking(AsyncSIEClient.list_models)
    get_model = _blocking(AsyncSIEClient.get_model)
    create_pool = _blocking(AsyncSIEClient.create_pool)
    get_pool = _blocking(AsyncSIEClient.get_pool)
    delete_pool = _blocking(AsyncSIEClient.delete_pool)
    get_capacity = _blocking(AsyncSIEClient.get_capacity)
    wait_for_capacity = _blocking(AsyncSIEClient.wait_for_capacity)


# The constructor's arguments as AsyncSIEClient's (the reference's and ours) for help() and inspect, which read it.
SIEClient.__init__.__signature__ = inspect.signature(Connection.__init__)  # type: ignore[attr-defined]
