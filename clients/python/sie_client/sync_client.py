"""SIEClient: the blocking twin of AsyncSIEClient.

It runs an AsyncSIEClient on a private event-loop thread, so both clients
share one implementation: same methods, same arguments, same results.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from sie_client.client import AsyncSIEClient

P = ParamSpec("P")
R = TypeVar("R")


def _blocking(method: Callable[Concatenate[AsyncSIEClient, P], Awaitable[R]]) -> Callable[Concatenate[SIEClient, P], R]:
    @functools.wraps(method)
    def call(self: SIEClient, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(method(self._client, *args, **kwargs))  # type: ignore[arg-type]

    return call


class SIEClient:
    def __init__(self, target: str | None = None, **kwargs: Any) -> None:
        """Same arguments as AsyncSIEClient."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sie-client", daemon=True)
        self._thread.start()
        try:
            self._client: AsyncSIEClient = self._run(self._create(target, kwargs))
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            raise

    @staticmethod
    async def _create(target: str | None, kwargs: dict[str, Any]) -> AsyncSIEClient:
        return AsyncSIEClient(target, **kwargs)

    @property
    def base_url(self) -> str:
        return self._client.base_url

    @property
    def target(self) -> str:
        return self._client.target

    def _run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> SIEClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    encode = _blocking(AsyncSIEClient.encode)
    score = _blocking(AsyncSIEClient.score)
    extract = _blocking(AsyncSIEClient.extract)
    list_models = _blocking(AsyncSIEClient.list_models)
    get_model = _blocking(AsyncSIEClient.get_model)
    create_pool = _blocking(AsyncSIEClient.create_pool)
    get_pool = _blocking(AsyncSIEClient.get_pool)
    delete_pool = _blocking(AsyncSIEClient.delete_pool)
    get_capacity = _blocking(AsyncSIEClient.get_capacity)
    wait_for_capacity = _blocking(AsyncSIEClient.wait_for_capacity)
