"""An error's trailers stay within what gRPC callers accept, whatever it repeats of a caller's values (issue 32: a
5,207-byte error trailer was dropped, and the caller got no status). The message is shortened first, then ErrorInfo
metadata dropped; the code, reason and retry delay always arrive."""

from __future__ import annotations

import grpc
import pytest

from grpc_helpers import error_reason, retry_delay_s
from sie_common.edge.errors import (
    MAX_STATUS_TRAILER_BYTES,
    InvalidArgument,
    SieError,
    Unavailable,
    abort,
    abort_with_status,
    fitted,
    status_trailer_bytes,
)

NOT_ASCII = "é€😀"  # 2, 3 and 4 bytes of UTF-8; grpc-message percent-encodes each byte


@pytest.mark.parametrize(
    "error",
    [
        InvalidArgument(NOT_ASCII * 2000, reason="BAD_FIELD", metadata={"field": NOT_ASCII * 500}),
        Unavailable(
            "x" * 900,
            reason="OVERLOADED",
            retry_after_s=2.0,
            metadata={f"key{n}": NOT_ASCII * 100 for n in range(40)},
        ),
    ],
)
async def test_a_huge_error_arrives_whole_with_its_code_reason_and_retry_delay(error: SieError) -> None:
    async def fail(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await abort(context, error)

    async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await abort_with_status(context, error.to_status())  # as the gateway passes a worker's status on

    server = grpc.aio.server()
    handlers = {"Fail": grpc.unary_unary_rpc_method_handler(fail), "Relay": grpc.unary_unary_rpc_method_handler(relay)}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.Errors", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in ("Fail", "Relay"):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary(f"/t.Errors/{method}")(b"")
                assert caught.value.code() == error.code
                assert error_reason(caught.value) == error.reason
                if error.retry_after_s is not None:
                    assert retry_delay_s(caught.value) == error.retry_after_s
                assert caught.value.details()
    finally:
        await server.stop(0)
    assert status_trailer_bytes(error.to_status()) > 3 * MAX_STATUS_TRAILER_BYTES
    assert status_trailer_bytes(fitted(error.to_status())) <= MAX_STATUS_TRAILER_BYTES


def test_an_error_that_fits_is_left_as_it_is() -> None:
    status = InvalidArgument("a" * 1000, reason="BAD", metadata={"field": "b" * 200}).to_status()
    assert fitted(status) == status
