"""LoRA adapters of one loaded model, chosen per request.

The base model loads once. An adapter loads through peft on first use, in the
background on the device thread (requests meanwhile get UNAVAILABLE with
reason LORA_LOADING); at most `capacity` stay loaded, the least recently used
is evicted and reloads on its next use. Every forward pass runs on the device
thread with exactly one adapter active (or none: the base model), so batches
of different adapters may alternate freely.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, TypeVar

import torch
from huggingface_hub import snapshot_download
from peft import PeftModel

from sie_common.edge.errors import FailedPrecondition, Unavailable
from sie_worker.models.load_lock import LOAD_LOCK
from sie_worker.weights.roots import WeightRoots, is_local_lora

log = logging.getLogger(__name__)

T = TypeVar("T")
# What a caller is told to wait while an adapter loads.
LOADING_RETRY_S = 1.0


class LoraAdapters:
    def __init__(
        self,
        model_id: str,
        target: torch.nn.Module,
        sources: Mapping[str, str],
        *,
        capacity: int,
        local_cache: str | None,
        hf_fallback: bool,
        roots: WeightRoots,
    ) -> None:
        self.model_id = model_id
        self._roots = roots
        self._target = target
        self._sources = dict(sources)
        self._capacity = capacity
        self._local_cache = local_cache
        self._hf_fallback = hf_fallback
        self._peft: PeftModel | None = None  # around `target`, made on the first load
        self._loaded: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._failed: dict[str, str] = {}

    @property
    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._loaded)

    def require(self, name: str, device_thread: Executor) -> None:
        """Return when `name` (one of the model's adapters) is loaded, marking it used; else start loading it and answer
        UNAVAILABLE."""
        if not name:
            return
        with self._lock:
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return
        if name in self._failed:
            raise FailedPrecondition(
                f"LoRA adapter {name!r} of {self.model_id} could not be loaded: {self._failed.pop(name)}",
                reason="LORA_LOAD_FAILED",
                metadata={"lora": name},
            )
        if name not in self._loading:
            loading = asyncio.get_running_loop().run_in_executor(device_thread, self._load, name)
            self._loading[name] = loading
            loading.add_done_callback(lambda done: self._loaded_callback(name, done))
        raise Unavailable(
            f"LoRA adapter {name!r} of {self.model_id} is loading; retry in {LOADING_RETRY_S:.0f} s",
            reason="LORA_LOADING",
            retry_after_s=LOADING_RETRY_S,
            metadata={"lora": name},
        )

    def run(self, name: str, forward: Callable[[Sequence[Any]], T], items: Sequence[Any]) -> T:
        """`forward(items)` with only adapter `name` active (the base model for ""). Device thread only."""
        if not name:
            if self._peft is None:
                return forward(items)
            with self._peft.disable_adapter():
                return forward(items)
        with self._lock:
            evicted_since = name not in self._loaded
        if evicted_since:
            self._load(name)
        assert self._peft is not None  # made by the first adapter's load
        self._peft.set_adapter(name)
        return forward(items)

    def _loaded_callback(self, name: str, done: asyncio.Future[None]) -> None:
        self._loading.pop(name, None)
        if not done.cancelled() and done.exception() is not None:
            self._failed[name] = str(done.exception())

    def _load(self, name: str) -> None:
        """Load `name`, evicting the least recently used adapter at capacity. Device thread only."""
        with self._lock:
            if name in self._loaded:
                return
        path = self._resolve(name, self._sources[name])
        with self._lock:
            while len(self._loaded) >= self._capacity:
                evicted, _ = self._loaded.popitem(last=False)
                assert self._peft is not None  # made by the first adapter's load
                self._peft.delete_adapter(evicted)
                log.info("evicted LoRA %s of %s (SIE_MAX_LORAS_PER_MODEL=%d)", evicted, self.model_id, self._capacity)
        with LOAD_LOCK:
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(self._target, str(path), adapter_name=name)
            else:
                self._peft.load_adapter(str(path), adapter_name=name)
        self._peft.eval()
        with self._lock:
            self._loaded[name] = None
        log.info("loaded LoRA %s of %s from %s", name, self.model_id, path)

    def _resolve(self, name: str, source: str) -> Path:
        """A local directory inside the weight roots; a hub id from the local cache, then the Hub when allowed."""
        if is_local_lora(source):
            self._roots.check(Path(source), model=self.model_id, what=f"loras.{name}")
            return Path(source)
        try:
            return Path(snapshot_download(source, cache_dir=self._local_cache, local_files_only=not self._hf_fallback))
        except Exception as error:
            raise RuntimeError(
                f"{source!r} is neither a local directory nor a reachable Hugging Face repo ({type(error).__name__})"
            ) from error
