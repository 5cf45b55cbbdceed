"""sie.v1.ConfigService: reads from any replica, writes through the leader."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from sie.v1 import config_pb2, config_pb2_grpc
from sie_common.cluster.config_messages import bundle_to_message, config_from_message, config_to_message
from sie_common.cluster.etcd import EtcdUnavailable
from sie_common.cluster.model_config import ModelConfig, ModelConfigError, weight_packages
from sie_common.edge.auth import Check, Metadata, token_check
from sie_common.edge.errors import (
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    SieError,
    Unavailable,
    abort,
    clipped,
)
from sie_config.metrics import REQUESTS
from sie_config.settings import ConfigSettings
from sie_config.store import ConfigStore, check_config_size, request_fingerprint

log = logging.getLogger(__name__)

T = TypeVar("T")
IDEMPOTENCY_KEY = "idempotency-key"
_METHOD = "/sie.v1.ConfigService/"
# What each admin RPC lets the caller do (the words its refusal uses).
ADMIN_READS = {
    "ExportConfigs": "export configs",
    "ListModelConfigs": "list model configs",
    "GetModelConfig": "read model configs",
}
ADMIN_WRITES = {"AddModel": "add models"}


def admin_checks(settings: ConfigSettings) -> dict[str, Check]:
    """The admin token on every admin RPC when one is set; without one, writes are refused unless
    SIE_ALLOW_UNAUTHENTICATED_ADMIN opens them (loopback only, see ConfigSettings) and reads stay open."""
    if settings.admin_token:
        return {
            _METHOD + rpc: token_check([settings.admin_token], what=what)
            for rpc, what in {**ADMIN_READS, **ADMIN_WRITES}.items()
        }
    if settings.allow_unauthenticated_admin:
        return {}
    return {_METHOD + rpc: _admin_disabled(what) for rpc, what in ADMIN_WRITES.items()}


def _admin_disabled(what: str) -> Check:
    def refuse(metadata: Metadata) -> None:
        raise PermissionDenied(
            f"admin writes are disabled: no SIE_ADMIN_TOKEN is set on the config service, so nobody may {what}. Set"
            " SIE_ADMIN_TOKEN and send 'authorization: Bearer <token>', or for a loopback-only dev stack set"
            " SIE_ALLOW_UNAUTHENTICATED_ADMIN=true",
            reason="ADMIN_DISABLED",
        )

    return refuse


class ConfigService(config_pb2_grpc.ConfigServiceServicer):
    """The admin token is checked before these handlers run (`admin_checks`, in the server's Authorize interceptor)."""

    def __init__(self, store: ConfigStore, settings: ConfigSettings) -> None:
        self._store = store
        self._allow_remote_code = settings.allow_remote_code
        self._max_config_bytes = settings.max_model_config_bytes
        self._weight_packages = weight_packages(settings.weight_packages)

    async def AddModel(
        self, request: config_pb2.AddModelRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.AddModelResponse:
        async def add() -> config_pb2.AddModelResponse:
            check_config_size(request.config.ByteSize(), self._max_config_bytes, "the config")
            try:
                config = config_from_message(request.config, source="AddModel config")
            except ModelConfigError as error:
                raise InvalidArgument(
                    str(error), reason="INVALID_MODEL_CONFIG", metadata={"field": error.field_path}
                ) from None
            self._check_weight_package(config)
            self._check_remote_code(config)
            key = dict(context.invocation_metadata() or ()).get(IDEMPOTENCY_KEY)  # str: not a -bin header
            return await self._store.add_model(config, str(key) if key else None, request_fingerprint(request))

        return await _answer(context, "AddModel", add)

    async def GetModelConfig(
        self, request: config_pb2.GetModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.GetModelConfigResponse:
        async def get() -> config_pb2.GetModelConfigResponse:
            if not request.model:
                raise InvalidArgument("model is required", reason="MISSING_MODEL")
            return config_pb2.GetModelConfigResponse(config=config_to_message(await self._store.model(request.model)))

        return await _answer(context, "GetModelConfig", get)

    async def ListModelConfigs(
        self, request: config_pb2.ListModelConfigsRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.ListModelConfigsResponse:
        async def list_configs() -> config_pb2.ListModelConfigsResponse:
            snapshot = await self._store.snapshot()
            return config_pb2.ListModelConfigsResponse(
                configs=[config_to_message(c) for _, c in sorted(snapshot.configs.items())]
            )

        return await _answer(context, "ListModelConfigs", list_configs)

    async def ExportConfigs(
        self, request: config_pb2.ExportConfigsRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.ExportConfigsResponse:
        async def export() -> config_pb2.ExportConfigsResponse:
            snapshot = await self._store.snapshot()
            hashes = snapshot.bundle_hashes()
            return config_pb2.ExportConfigsResponse(
                configs=[config_to_message(c) for _, c in sorted(snapshot.configs.items())],
                bundles=[bundle_to_message(b, hashes[b.id]) for _, b in sorted(snapshot.bundles.items())],
                epoch=snapshot.epoch,
                bundle_set_hash=snapshot.bundle_set_hash,
            )

        return await _answer(context, "ExportConfigs", export)

    async def GetEpoch(
        self, request: config_pb2.GetEpochRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.GetEpochResponse:
        async def epoch() -> config_pb2.GetEpochResponse:
            snapshot = await self._store.snapshot(with_models=False)
            return config_pb2.GetEpochResponse(epoch=snapshot.epoch, bundle_set_hash=snapshot.bundle_set_hash)

        return await _answer(context, "GetEpoch", epoch)

    async def ListBundles(
        self, request: config_pb2.ListBundlesRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.ListBundlesResponse:
        async def list_bundles() -> config_pb2.ListBundlesResponse:
            snapshot = await self._store.snapshot()
            hashes = snapshot.bundle_hashes()
            return config_pb2.ListBundlesResponse(
                bundles=[bundle_to_message(b, hashes[b.id]) for _, b in sorted(snapshot.bundles.items())]
            )

        return await _answer(context, "ListBundles", list_bundles)

    async def GetBundle(
        self, request: config_pb2.GetBundleRequest, context: grpc.aio.ServicerContext
    ) -> config_pb2.GetBundleResponse:
        async def get_bundle() -> config_pb2.GetBundleResponse:
            snapshot = await self._store.snapshot()
            bundle = snapshot.bundles.get(request.bundle_id)
            if bundle is None:
                raise NotFound(
                    f"no bundle {clipped(request.bundle_id)!r}; bundles: "
                    f"{', '.join(sorted(snapshot.bundles)) or 'none published yet'}",
                    reason="BUNDLE_NOT_FOUND",
                    metadata={"bundle": clipped(request.bundle_id)},
                )
            return config_pb2.GetBundleResponse(bundle=bundle_to_message(bundle, snapshot.bundle_hashes()[bundle.id]))

        return await _answer(context, "GetBundle", get_bundle)

    def _check_weight_package(self, config: ModelConfig) -> None:
        package = (config.bundled_weights or "").partition(":")[0]
        if package and package not in self._weight_packages:
            raise InvalidArgument(
                f"model {config.id!r}: bundled_weights names package {package!r}, which is not a weight package of "
                f"this engine ({', '.join(sorted(self._weight_packages))}); name one of those, or add it to "
                "SIE_WEIGHT_PACKAGES on the config service and the workers",
                reason="WEIGHT_PACKAGE_NOT_ALLOWED",
                metadata={"model": config.id, "package": package},
            )

    def _check_remote_code(self, config: ModelConfig) -> None:
        trusting = sorted(name for name, profile in config.profiles.items() if profile.trust_remote_code)
        if trusting and not self._allow_remote_code:
            raise PermissionDenied(
                f"model {config.id!r}: profile(s) {', '.join(trusting)} set load_options.trust_remote_code, which "
                f"runs code"
                " shipped with the weights; this config service does not accept that (set SIE_ALLOW_REMOTE_CODE=true "
                "on it"
                " to allow it, and on the workers that should run it)",
                reason="REMOTE_CODE_DISABLED",
                metadata={"model": config.id},
            )


async def _answer(context: grpc.aio.ServicerContext, operation: str, handle: Callable[[], Awaitable[T]]) -> T:
    """Run a handler; SieErrors become their status, etcd outages UNAVAILABLE, anything else INTERNAL.
    Each call is counted in sie_config_requests_total by RPC name (operation) and status; `model` stays empty."""
    with REQUESTS.observe(operation, "", "") as outcome:
        try:
            return await handle()
        except SieError as error:
            failure = error
        except EtcdUnavailable as error:
            failure = Unavailable(f"etcd is unavailable: {error}", reason="ETCD_UNAVAILABLE", retry_after_s=1)
        except Exception as error:
            log.exception("config service bug")
            failure = Internal(f"internal error: {error}", reason="INTERNAL")
        outcome.failed(failure)
        await abort(context, failure)
