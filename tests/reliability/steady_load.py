"""A steady load of Encode calls through the gateway, every answer checked, while a fault is injected.

Each client thread sends one request at a time (its own request_id, a text
whose reference vector was computed beforehand) and, like the SDK, tries a
failed call again when the SDK's RetryPolicy says so (UNAVAILABLE,
RESOURCE_EXHAUSTED, with its delays). What is counted:

- sent: requests started (a retry is not a new request);
- ok: answered with the right request_id and a vector equal to the reference;
- failed: ended with an error after the retries the policy allows (by status/reason);
- retried: attempts that failed with a retryable status and were tried again (by status/reason);
- wrong: answered with a wrong vector or another request's id;
- lost: sent but never answered when the load stopped (a hang);
- duplicated: request ids answered more than once;
- recovery_s: from the fault to the first answer after the last failed attempt (0: none failed);
  an upper bound by up to one backoff, since clients wait between tries.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import numpy as np

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_client.retry import RetryPolicy
from sie_client.status import call_status
from sie_contract.tensors import from_tensor

# The SDK's policy, with more tries on UNAVAILABLE so a client rides out a gateway restart (~10 s).
FAULT_POLICY = RetryPolicy(busy_attempts=16)


@dataclass
class LoadFigures:
    sent: int = 0
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    retried: Counter[str] = field(default_factory=Counter)
    wrong: int = 0
    lost: int = 0
    duplicated: int = 0
    recovery_s: float = 0.0
    served_by: Counter[str] = field(default_factory=Counter)

    def row(self) -> dict[str, object]:
        """The figures of a "faults" row of the reliability summary."""
        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": sum(self.failed.values()),
            "lost": self.lost,
            "duplicated": self.duplicated,
            "recovery_s": self.recovery_s,
            "retried": sum(self.retried.values()),
            "wrong": self.wrong,
            **({"failed_with": _tally(self.failed)} if self.failed else {}),
            **({"retried_with": _tally(self.retried)} if self.retried else {}),
        }


def _tally(counts: Counter[str]) -> str:
    return " ".join(f"{what}:{n}" for what, n in sorted(counts.items()))


def reference_vectors(address: str, model: str, texts: list[str]) -> dict[str, np.ndarray]:
    """Each text's vector, answered once before any load or fault."""
    with grpc.insecure_channel(address) as channel:
        request = inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=text) for text in texts])
        response = inference_pb2_grpc.InferenceStub(channel).Encode(request, timeout=60)
    return {text: from_tensor(result.dense) for text, result in zip(texts, response.results, strict=True)}


class SteadyLoad:
    def __init__(
        self,
        address: str,
        model: str,
        references: dict[str, np.ndarray],
        *,
        clients: int = 4,
        attempt_timeout_s: float = 10.0,
        pause_s: float = 0.02,
        policy: RetryPolicy = FAULT_POLICY,
    ) -> None:
        self._model = model
        self._references = references
        self._texts = sorted(references)
        self._attempt_timeout_s = attempt_timeout_s
        self._pause_s = pause_s
        self._policy = policy
        self._channel = grpc.insecure_channel(address)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(index,), daemon=True) for index in range(clients)]
        self._in_flight: set[str] = set()
        self._answered: Counter[str] = Counter()
        self._failed_attempts_end: list[float] = []
        self._answers_end: list[float] = []
        self.figures = LoadFigures()
        self.fault_at: float | None = None
        self.longest_attempt_s = 0.0

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._stopping.is_set():
            self.stop()

    def mark_fault(self) -> None:
        self.fault_at = time.monotonic()

    def wait_for_answers(self, count: int, timeout_s: float = 60, what: str = "answers") -> None:
        """Return once `count` more requests have been answered correctly (TimeoutError otherwise)."""
        target = self.figures.ok + count
        deadline = time.monotonic() + timeout_s
        while self.figures.ok < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: only {self.figures.ok - target + count} of {count} answers in {timeout_s} s")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 120) -> LoadFigures:
        """Stop sending; wait for the requests in flight (those never answered count as lost)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            figures = self.figures
            figures.lost = len(self._in_flight)
            figures.duplicated = sum(count - 1 for count in self._answered.values() if count > 1)
            if self.fault_at is not None and self._failed_attempts_end:
                last_failure = max(self._failed_attempts_end)
                back = min((end for end in self._answers_end if end > last_failure), default=last_failure)
                figures.recovery_s = round(max(0.0, back - self.fault_at), 2)
        if not figures.lost:
            self._channel.close()
        return figures

    def _client(self, index: int) -> None:
        for number in itertools.count():
            if self._stopping.is_set():
                return
            request_id = f"c{index}-{number}"
            text = self._texts[(index * 7 + number) % len(self._texts)]
            with self._lock:
                self.figures.sent += 1
                self._in_flight.add(request_id)
            self._send(request_id, text)
            with self._lock:
                self._in_flight.discard(request_id)
            if self._pause_s:
                time.sleep(self._pause_s)

    def _send(self, request_id: str, text: str) -> None:
        request = inference_pb2.EncodeRequest(model=self._model, request_id=request_id, items=[types_pb2.Item(text=text)])
        started = time.monotonic()
        for attempt in itertools.count(1):
            sent = time.monotonic()
            try:
                response, call = self._stub.Encode.with_call(request, timeout=self._attempt_timeout_s)
            except grpc.RpcError as error:
                ended = time.monotonic()
                status = call_status(error)
                delay = self._policy.delay(status, attempt, ended - started)
                with self._lock:
                    self.longest_attempt_s = max(self.longest_attempt_s, ended - sent)
                    self._failed_attempts_end.append(ended)
                    outcome = f"{status.code.name}/{status.reason}" if status.reason else status.code.name
                    if delay is None:
                        self.figures.failed[outcome] += 1
                    else:
                        self.figures.retried[outcome] += 1
                if delay is None:
                    return
                time.sleep(delay)
                continue
            self._check(request_id, text, response, dict(call.trailing_metadata() or ()).get("x-sie-worker", ""), time.monotonic() - sent)
            return

    def _check(self, request_id: str, text: str, response: inference_pb2.EncodeResponse, worker: str, took_s: float) -> None:
        right = (
            response.request_id == request_id
            and len(response.results) == 1
            and np.allclose(from_tensor(response.results[0].dense), self._references[text], atol=1e-4)
        )
        with self._lock:
            self.longest_attempt_s = max(self.longest_attempt_s, took_s)
            self._answered[response.request_id] += 1
            self._answers_end.append(time.monotonic())
            if right:
                self.figures.ok += 1
                self.figures.served_by[worker] += 1
            else:
                self.figures.wrong += 1


def rss_mb(pid: int) -> float:
    """Resident set size of a process, in MiB (from /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")
