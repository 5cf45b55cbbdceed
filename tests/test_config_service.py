"""The config service against a real etcd: grpcurl writes, the epoch, export, append-only rules, idempotency, auth."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from sie.v1 import config_pb2, config_pb2_grpc
from local_cluster import wait_for_leader
from sie_common.cluster.bundles import load_bundles
from sie_common.cluster.etcd import Etcd
from test_grpcurl import grpcurl
from worker_process import WorkerProcess, free_port

MODEL = "test/config-added"


def model_config(model_id: str = MODEL, **profiles: dict) -> dict:
    return {
        "id": model_id,
        "path": "/models/config-added",
        "profiles": profiles or {"default": {"adapter": "sentence_transformer"}},
    }


def error_reason(error: grpc.RpcError) -> tuple[str, dict[str, str]]:
    """The ErrorInfo reason and metadata a SIE error carries."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info.reason, dict(info.metadata)
    raise AssertionError(f"no ErrorInfo in {error}")



@pytest.fixture
def config(start_config) -> WorkerProcess:
    replica = start_config()
    with grpc.insecure_channel(replica.address) as channel:
        wait_for_leader(config_pb2_grpc.ConfigServiceStub(channel))
    return replica


@pytest.fixture
def config_stub(config: WorkerProcess) -> Iterator[config_pb2_grpc.ConfigServiceStub]:
    with grpc.insecure_channel(config.address) as channel:
        yield config_pb2_grpc.ConfigServiceStub(channel)


async def test_grpcurl_add_model_moves_epoch_to_the_write_and_export_contains_it(config, config_stub, etcd: Etcd) -> None:
    assert {"sie.v1.ConfigService", "grpc.health.v1.Health"} <= set(grpcurl(config.address, "list").split())
    before = config_stub.GetEpoch(config_pb2.GetEpochRequest())

    reply = json.loads(grpcurl(config.address, "-d", json.dumps({"config": model_config()}), "sie.v1.ConfigService/AddModel"))

    assert reply["model"] == MODEL and reply["created"] is True and reply["added_profiles"] == ["default"]
    stored = await etcd.get("models/" + MODEL)
    assert stored is not None
    assert int(reply["epoch"]) == stored.mod_revision > before.epoch
    epoch = config_stub.GetEpoch(config_pb2.GetEpochRequest())
    assert epoch.epoch == stored.mod_revision
    assert epoch.bundle_set_hash == before.bundle_set_hash != ""

    # Writes that are not model writes leave the epoch alone, though etcd's revision moves.
    unrelated = await etcd.put("unrelated/key", b"x")
    await etcd.put("config/idempotency/someone-else", b"{}")
    assert unrelated > stored.mod_revision
    assert config_stub.GetEpoch(config_pb2.GetEpochRequest()).epoch == stored.mod_revision

    export = config_stub.ExportConfigs(config_pb2.ExportConfigsRequest())
    assert export.epoch == stored.mod_revision
    assert [c.id for c in export.configs] == [MODEL]
    assert export.configs[0].profiles["default"].adapter == "sentence_transformer"
    assert [b.id for b in export.bundles] == sorted(load_bundles(Path(__file__).parents[1] / "bundles")) and export.bundles[0].config_hash
    assert export.bundle_set_hash == epoch.bundle_set_hash


def test_append_only_by_profile(config_stub) -> None:
    first = config_stub.AddModel(config_pb2.AddModelRequest(config=model_config()))
    assert (first.created, list(first.added_profiles), list(first.skipped_profiles)) == (True, ["default"], [])

    same = config_stub.AddModel(config_pb2.AddModelRequest(config=model_config()))
    assert (same.created, list(same.added_profiles), list(same.skipped_profiles)) == (False, [], ["default"])
    assert same.epoch == first.epoch  # nothing written

    grown = config_stub.AddModel(config_pb2.AddModelRequest(config=model_config(
        default={"adapter": "sentence_transformer"},
        small={"extends": "default", "max_batch_tokens": 1024},
    )))
    assert (grown.created, list(grown.added_profiles), list(grown.skipped_profiles)) == (False, ["small"], ["default"])
    assert grown.epoch > first.epoch
    stored = config_stub.GetModelConfig(config_pb2.GetModelConfigRequest(model=MODEL)).config
    assert sorted(stored.profiles) == ["default", "small"]
    assert stored.profiles["small"].max_batch_tokens == 1024

    with pytest.raises(grpc.RpcError) as conflict:
        config_stub.AddModel(config_pb2.AddModelRequest(config=model_config(default={"adapter": "sentence_transformer", "max_batch_tokens": 7})))
    assert conflict.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_reason(conflict.value) == ("PROFILE_CONFLICT", {"model": MODEL, "profile": "default"})

    with pytest.raises(grpc.RpcError) as metadata:
        config_stub.AddModel(config_pb2.AddModelRequest(config={**model_config(), "dims": 64}))
    assert metadata.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(metadata.value)[0] == "MODEL_METADATA_CONFLICT"
    assert "dims" in metadata.value.details()

    assert config_stub.GetEpoch(config_pb2.GetEpochRequest()).epoch == grown.epoch  # refused writes wrote nothing


def test_bad_configs_are_refused_with_reasons(config_stub) -> None:
    with pytest.raises(grpc.RpcError) as invalid:
        config_stub.AddModel(config_pb2.AddModelRequest(config={"id": MODEL, "path": "/x", "profiles": {"small": {"adapter": "sentence_transformer"}}}))
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(invalid.value)[0] == "INVALID_MODEL_CONFIG"
    assert "'default' profile" in invalid.value.details()

    with pytest.raises(grpc.RpcError) as unroutable:
        config_stub.AddModel(config_pb2.AddModelRequest(config=model_config(default={"adapter": "no_such_adapter"})))
    assert unroutable.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(unroutable.value)[0] == "NO_BUNDLE_FOR_PROFILE"

    with pytest.raises(grpc.RpcError) as missing:
        config_stub.GetModelConfig(config_pb2.GetModelConfigRequest(model="test/never-added"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert config_stub.ListModelConfigs(config_pb2.ListModelConfigsRequest()).configs == []
    assert config_stub.GetEpoch(config_pb2.GetEpochRequest()).epoch == 0


def test_bundles_are_published_and_served(config_stub) -> None:
    bundles = config_stub.ListBundles(config_pb2.ListBundlesRequest()).bundles
    repository = load_bundles(Path(__file__).parents[1] / "bundles")
    assert [(b.id, list(b.adapters), list(b.exclude_models)) for b in bundles] == [
        (bundle.id, list(bundle.adapters), list(bundle.exclude_models)) for bundle in sorted(repository.values(), key=lambda b: b.id)
    ]
    empty_hash = bundles[0].config_hash
    config_stub.AddModel(config_pb2.AddModelRequest(config=model_config()))
    bundle = config_stub.GetBundle(config_pb2.GetBundleRequest(bundle_id="default")).bundle
    assert bundle.config_hash != empty_hash  # the bundle now serves one more model
    with pytest.raises(grpc.RpcError) as missing:
        config_stub.GetBundle(config_pb2.GetBundleRequest(bundle_id="gpu-extra"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(missing.value)[0] == "BUNDLE_NOT_FOUND"


async def test_idempotency_key_replays_the_first_answer(config_stub, etcd: Etcd) -> None:
    key = (("idempotency-key", "add-config-added-1"),)
    first = config_stub.AddModel(config_pb2.AddModelRequest(config=model_config()), metadata=key)
    # Another writer adds a profile in between; the replay still answers as the first call did.
    config_stub.AddModel(config_pb2.AddModelRequest(config=model_config(
        default={"adapter": "sentence_transformer"}, other={"extends": "default"},
    )))
    replay = config_stub.AddModel(config_pb2.AddModelRequest(config=model_config()), metadata=key)
    assert replay == first and replay.created

    record = await etcd.get("config/idempotency/add-config-added-1")
    assert record is not None and record.mod_revision == first.epoch  # committed with the write

    with pytest.raises(grpc.RpcError) as reused:
        config_stub.AddModel(config_pb2.AddModelRequest(config=model_config("test/other-model")), metadata=key)
    assert reused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(reused.value)[0] == "IDEMPOTENCY_KEY_REUSED"
    with pytest.raises(grpc.RpcError):
        config_stub.GetModelConfig(config_pb2.GetModelConfigRequest(model="test/other-model"))


def test_admin_token_guards_writes_and_export(start_config) -> None:
    replica = start_config(SIE_ADMIN_TOKEN="s3cret-admin")
    with grpc.insecure_channel(replica.address) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        wait_for_leader(stub)
        request = config_pb2.AddModelRequest(config=model_config())
        for call in (lambda **kw: stub.AddModel(request, **kw), lambda **kw: stub.ExportConfigs(config_pb2.ExportConfigsRequest(), **kw)):
            with pytest.raises(grpc.RpcError) as missing:
                call()
            assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_reason(missing.value)[0] == "MISSING_TOKEN"
            with pytest.raises(grpc.RpcError) as wrong:
                call(metadata=(("authorization", "Bearer s3cret-admiN"),))
            assert wrong.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error_reason(wrong.value)[0] == "INVALID_TOKEN"
            assert "s3cret" not in wrong.value.details()
        good = (("authorization", "Bearer s3cret-admin"),)
        assert stub.AddModel(request, metadata=good).created
        assert [c.id for c in stub.ExportConfigs(config_pb2.ExportConfigsRequest(), metadata=good).configs] == [MODEL]
        assert stub.GetEpoch(config_pb2.GetEpochRequest()).epoch > 0  # reads stay open
    assert "s3cret" not in replica.log()


@pytest.mark.process
def test_unreachable_etcd_stops_the_service_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sie_config", "serve", "--etcd-endpoints", f"127.0.0.1:{free_port()}", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "cannot reach etcd at 127.0.0.1:" in result.stderr
