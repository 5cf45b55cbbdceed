"""grpc.health.v1 is open to anyone on every service's port (and through Envoy's 8080 as native gRPC), with or
without tokens: what one call may hold is bounded. Before, a Watch kept its request for as long as the caller
stayed, whatever its service name: 60 Watches naming a 4 MB service grew a gateway from 80 MB to 1,015 MB (issue 32,
attack round 3). Against a real worker process, which serves health the same way as the gateway and the config
service (sie_common.runtime.grpc_server)."""

from __future__ import annotations

import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpc_helpers import error_reason

# sie_common.runtime.grpc_server's bounds (literals, so this test runs against code without them).
MAX_HEALTH_SERVICE_CHARS = 256
MAX_HEALTH_WATCHES = 100
MB = 2**20


@pytest.fixture(scope="module")
def target(start_module_worker):
    return start_module_worker(SIE_PRELOAD_MODELS="")


def rss(process) -> int:
    return int(psutil.Process(process.process.pid).memory_info().rss)


def test_watches_naming_huge_services_do_not_grow_the_process(target, reliability_report) -> None:
    before = rss(target)
    options = [("grpc.max_send_message_length", 64 * MB)]
    with grpc.insecure_channel(target.address, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        calls, codes = [], []
        for index in range(20):
            call = stub.Watch(health_pb2.HealthCheckRequest(service="s" * (4 * MB) + str(index)), timeout=60)
            calls.append(call)
            try:
                next(call)  # the old servicer answers SERVICE_UNKNOWN and keeps the stream (and its 4 MB) open
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                codes.append(error.code())
                assert error_reason(error) == "NAME_TOO_LONG"
        time.sleep(1)
        grown = rss(target) - before
        for call in calls:
            call.cancel()
        with pytest.raises(grpc.RpcError) as raised:
            stub.Check(health_pb2.HealthCheckRequest(service="s" * (MAX_HEALTH_SERVICE_CHARS + 1)), timeout=10)
        check_code = raised.value.code()
        assert (
            stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    reliability_report.add("health", "20 Watch streams naming 4 MB services", rss_growth_mb=grown // MB)
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 20
    assert check_code == grpc.StatusCode.INVALID_ARGUMENT
    assert grown < 160 * MB, f"the process grew by {grown // MB} MB"  # held, the 20 streams took some 300 MB


def test_watch_streams_at_once_are_bounded_and_come_back(target) -> None:
    with grpc.insecure_channel(target.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        held = []
        for _ in range(MAX_HEALTH_WATCHES):
            call = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            assert next(call).status == health_pb2.HealthCheckResponse.SERVING
            held.append(call)
        one_more = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        with pytest.raises(grpc.RpcError) as raised:
            next(one_more)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(raised.value) == "TOO_MANY_STREAMS"
        for call in held:
            call.cancel()
        deadline = time.monotonic() + 10
        while True:  # a cancelled Watch frees its place as soon as the server sees the cancellation
            again = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            try:
                assert next(again).status == health_pb2.HealthCheckResponse.SERVING
                again.cancel()
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, "Watch places did not come back"
                time.sleep(0.2)
