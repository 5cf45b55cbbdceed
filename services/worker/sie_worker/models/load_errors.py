"""Load failures: which ones another attempt can fix (retried after a cool-down that doubles) and which stay until
the worker's packages, the model config or the model files change (permanent), and how callers are told."""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

from sie_common.cluster.model_config import ModelConfigError
from sie_common.edge.errors import FailedPrecondition
from sie_worker.adapters.contract import MissingPackage
from sie_worker.weights.resolver import WeightsNotFound

# Cool-downs after retryable failures double up to this.
MAX_COOLDOWN_S = 300.0
# Characters of a load failure's cause that callers see (the log has it whole): errors travel in gRPC trailers,
# which a caller refuses past 8 KiB, and a cause can be any size (a config value, every key of a checkpoint).
FAILURE_CHARS = 1024


@dataclass
class LoadFailure:
    error: str
    attempts: int
    permanent: bool
    retry_at: float  # time.monotonic() after which a request may try again
    # A precise refusal the load raised itself (e.g. the adapter lacks a configured output): answered as is.
    refusal: FailedPrecondition | None = None

    def retry_in_s(self) -> float:
        return 0.0 if self.permanent else max(0.0, self.retry_at - time.monotonic())


# Failures that another attempt can fix: memory that may be freed, a source that may come back.
_RETRYABLE = (torch.OutOfMemoryError, MemoryError, ConnectionError, TimeoutError)
# OS errors of a moment (a full disk, an I/O fault, too many open files) rather than of the model directory.
_TRANSIENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EIO, errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ESTALE, errno.EINTR}
)
# Failures that only a change to the worker's packages, the model config or the model directory fixes:
# a missing Python dependency, an unsupported architecture or layout (ValueError, KeyError,
# NotImplementedError), a missing or unreadable file in the resolved (local) directory (OSError), a config
# value the model cannot be built from (a wrong type that transformers' config validation or torch refuses,
# a zero that it divides by).
_PERMANENT = (
    FailedPrecondition,
    MissingPackage,
    ModelConfigError,
    ImportError,
    ValueError,
    KeyError,
    NotImplementedError,
    OSError,
    SafetensorError,
    StrictDataclassError,
    TypeError,
    ArithmeticError,
)
# RuntimeErrors torch raises when an allocation fails (the CPU allocator's, CUDA's own out-of-memory message).
_OUT_OF_MEMORY_MESSAGES = ("out of memory", "can't allocate memory")
# RuntimeErrors transformers and torch raise for weights that do not fit the architecture.
_BAD_WEIGHTS_MESSAGES = ("ignore_mismatched_sizes", "Error(s) in loading state_dict", "size mismatch")


def is_permanent(error: BaseException) -> bool:
    """Whether a load failure stays until the worker's packages, the config or the model files change.

    Permanent: missing weights (every source missed), a missing Python dependency anywhere in loading (an
    ImportError in the error or its causes), an unsupported architecture or layout, a bad or missing file in
    the model directory, a config value the model cannot be built from, weights that do not fit the
    architecture, an adapter the worker lacks. Retryable:
    out of memory, a cache or the Hub unreachable, transient OS errors, and anything not known to be permanent.
    """
    if isinstance(error, WeightsNotFound):
        return not error.retryable
    if isinstance(error, _RETRYABLE) or (isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS):
        return False
    # Before the ImportError chain: code that falls back when an optional import fails may run out of memory
    # in its `except ImportError` block, and the ImportError is then the failure's context, not its cause.
    if isinstance(error, RuntimeError) and any(message in str(error) for message in _OUT_OF_MEMORY_MESSAGES):
        return False
    if _import_error_in(error) is not None:
        return True
    if isinstance(error, RuntimeError):
        return any(message in str(error) for message in _BAD_WEIGHTS_MESSAGES)
    return isinstance(error, _PERMANENT)


def _import_error_in(error: BaseException) -> ImportError | None:
    """The ImportError in an error's chain of causes, if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ImportError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe_failure(error: BaseException) -> str:
    """The cause of a load failure for callers: our own errors as they are, others with their type (and a
    missing dependency behind them)."""
    if isinstance(error, (FailedPrecondition, MissingPackage, ModelConfigError, WeightsNotFound)):
        return str(error)
    described = f"{type(error).__name__}: {error}"
    missing = _import_error_in(error)
    if missing is not None and missing is not error:
        described += f" (caused by {type(missing).__name__}: {missing})"
    return described


def refusal_of(error: BaseException) -> FailedPrecondition | None:
    """The precise refusal a load failure is answered with, where it has one (else the registry's MODEL_LOAD_FAILED
    or MODEL_LOAD_BACKOFF): a FAILED_PRECONDITION the load raised itself, or a package the model's family needs."""
    if isinstance(error, FailedPrecondition):
        return error
    if isinstance(error, MissingPackage):
        return FailedPrecondition(error.message, reason="ADAPTER_DEPENDENCY_MISSING", metadata=error.metadata)
    return None
