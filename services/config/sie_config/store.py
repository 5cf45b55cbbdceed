"""Model configs and bundles in etcd: append-only writes by profile, consistent reads, the epoch.

A write reads the model's current config, merges the request into it, and
commits in one transaction that holds only if the model key is unchanged since
that read and this replica still leads; on a conflict it reads again and
retries, so concurrent writes are neither lost nor clobbered. The same
transaction moves the epoch key, whose mod_revision is the epoch.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from sie.v1 import config_pb2
from sie_common.cluster import config_store
from sie_common.cluster.bundles import Bundle, bundle_config_hash, bundle_set_hash
from sie_common.cluster.etcd import Etcd
from sie_common.cluster.model_config import ModelConfig, parse_model_config
from sie_common.edge.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SieError,
    Unavailable,
    clipped,
)
from sie_config.leader import LeaderElection

log = logging.getLogger(__name__)

IDEMPOTENCY = "config/idempotency/"
# Attempts of one write before answering UNAVAILABLE (each loses only to another committed write).
WRITE_ATTEMPTS = 20


@dataclass(frozen=True)
class Snapshot:
    """Every model config and bundle as of one epoch."""

    configs: dict[str, ModelConfig]
    bundles: dict[str, Bundle]
    epoch: int

    def bundle_hashes(self) -> dict[str, str]:
        return {
            bundle_id: bundle_config_hash(bundle, self.configs.values()) for bundle_id, bundle in self.bundles.items()
        }

    @property
    def bundle_set_hash(self) -> str:
        return bundle_set_hash(self.bundles.values())


class ConfigStore:
    def __init__(
        self,
        etcd: Etcd,
        election: LeaderElection,
        bundles: Mapping[str, Bundle],
        idempotency_ttl_s: int,
        max_config_bytes: int,
    ) -> None:
        self._etcd = etcd
        self._election = election
        self._bundles = dict(bundles)
        self._idempotency_ttl_s = idempotency_ttl_s
        self._max_config_bytes = max_config_bytes

    # -- reads (any replica) ------------------------------------------------

    async def epoch(self) -> int:
        """The revision of the last model write (0 before the first)."""
        entry = await self._etcd.get(config_store.EPOCH)
        return entry.mod_revision if entry else 0

    async def snapshot(self, *, with_models: bool = True) -> Snapshot:
        """Bundles, epoch and (unless not needed) models read at one etcd revision."""
        bundles, revision = await self._etcd.read_prefix(config_store.BUNDLES)
        models = (await self._etcd.read_prefix(config_store.MODELS, revision))[0] if with_models else []
        epoch = await self._etcd.get(config_store.EPOCH, revision)
        return Snapshot(
            configs=config_store.decode_models(
                {entry.name.removeprefix(config_store.MODELS): entry.value for entry in models}
            ),
            bundles=config_store.decode_bundles(
                {entry.name.removeprefix(config_store.BUNDLES): entry.value for entry in bundles}
            ),
            epoch=epoch.mod_revision if epoch else 0,
        )

    async def model(self, model_id: str) -> ModelConfig:
        entry = await self._etcd.get(config_store.model_name(model_id))
        if entry is None:
            raise NotFound(
                f"no model config {clipped(model_id)!r}",
                reason="MODEL_NOT_FOUND",
                metadata={"model": clipped(model_id)},
            )
        return config_store.decode_model(entry.value, source=f"etcd {config_store.model_name(model_id)}")

    # -- writes (the leader) ------------------------------------------------

    async def publish_bundles(self) -> None:
        """Make the bundles in etcd exactly this replica's set (called when it becomes leader)."""
        stored, _ = await self._etcd.read_prefix(config_store.BUNDLES)
        wanted = {
            config_store.bundle_name(bundle.id): config_store.encode_bundle(bundle) for bundle in self._bundles.values()
        }
        ops = self._etcd.ops
        writes = [ops.put(self._etcd.key(name), value) for name, value in wanted.items()]
        writes += [ops.delete(self._etcd.key(entry.name)) for entry in stored if entry.name not in wanted]
        published, revision = await self._etcd.txn([self._election.guard()], writes)
        if published:
            log.info("published bundles %s at revision %d", ", ".join(sorted(self._bundles)), revision)

    async def add_model(
        self, config: ModelConfig, idempotency_key: str | None, fingerprint: str
    ) -> config_pb2.AddModelResponse:
        """Append the config's new profiles (or the whole model); see docs/control-plane.md."""
        self._require_routable(config)
        for _ in range(WRITE_ATTEMPTS):
            if idempotency_key:
                replay = await self._replay(idempotency_key, fingerprint)
                if replay is not None:
                    return replay
            self._require_leader()
            name = config_store.model_name(config.id)
            current = await self._etcd.get(name)
            stored = config_store.decode_model(current.value, source=f"etcd {name}") if current else None
            merged, answer = _merge(stored, config)
            encoded = config_store.encode_model(merged)
            if stored is None:
                check_config_size(len(encoded), self._max_config_bytes, "the config as stored")
            else:
                check_config_size(
                    len(encoded), self._max_config_bytes, "the stored config with these profiles", FailedPrecondition
                )
            ops, key = self._etcd.ops, self._etcd.key(name)
            compare = [self._election.guard(), ops.mod(key) == (current.mod_revision if current else 0)]
            writes = []
            if answer.added_profiles:
                writes += [
                    ops.put(key, encoded),
                    ops.put(self._etcd.key(config_store.EPOCH), config.id.encode()),
                ]
            epoch_before = await self.epoch()
            if idempotency_key:
                record = _idempotency_record(answer, fingerprint, wrote=bool(writes), epoch=epoch_before)
                idem_key = self._etcd.key(IDEMPOTENCY + idempotency_key)
                lease = await self._etcd.grant_lease(self._idempotency_ttl_s)
                compare.append(ops.create(idem_key) == 0)
                writes.append(ops.put(idem_key, record, lease=lease))
            if not writes:
                answer.epoch = epoch_before
                return answer
            committed, revision = await self._etcd.txn(compare, writes)
            if idempotency_key and not committed:
                await self._etcd.revoke_lease(lease)
            if committed:
                answer.epoch = revision if answer.added_profiles else epoch_before
                if answer.added_profiles:
                    log.info(
                        "model %s: added profiles %s at revision %d",
                        config.id,
                        ", ".join(answer.added_profiles),
                        revision,
                    )
                return answer
        raise Unavailable(
            f"model {config.id!r}: too many concurrent writes to the same model; retry",
            reason="WRITE_CONFLICT",
            retry_after_s=1,
            metadata={"model": config.id},
        )

    def _require_leader(self) -> None:
        if self._election.is_leader:
            return
        leader = self._election.leader_address
        if leader is None or leader == self._election.address:  # none elected, or this one's lease is in doubt
            raise Unavailable("no config leader is elected yet; retry shortly", reason="NO_LEADER", retry_after_s=1)
        raise Unavailable(
            f"this config replica is not the leader; send writes to {leader}",
            reason="NOT_LEADER",
            retry_after_s=1,
            metadata={"leader": leader},
        )

    def _require_routable(self, config: ModelConfig) -> None:
        """Refuse profiles that no bundle can serve: no worker would ever run them."""
        for name in sorted(config.profiles):
            adapter = config.profile(name).adapter
            if not any(bundle.can_serve(config) and adapter in bundle.adapters for bundle in self._bundles.values()):
                shown = clipped(str(adapter))
                offered = "; ".join(f"{b.id}: {', '.join(b.adapters)}" for b in self._bundles.values()) or "none"
                raise FailedPrecondition(
                    f"model {config.id!r} profile {name!r}: no bundle serves adapter {shown!r} for this model "
                    f"(bundles and their adapters: {offered})",
                    reason="NO_BUNDLE_FOR_PROFILE",
                    metadata={"model": config.id, "profile": name, "adapter": shown},
                )

    async def _replay(self, idempotency_key: str, fingerprint: str) -> config_pb2.AddModelResponse | None:
        entry = await self._etcd.get(IDEMPOTENCY + idempotency_key)
        if entry is None:
            return None
        record = json.loads(entry.value)
        if record["fingerprint"] != fingerprint:
            raise InvalidArgument(
                "idempotency-key was already used for a different request; use a new key for a new request",
                reason="IDEMPOTENCY_KEY_REUSED",
            )
        answer = config_pb2.AddModelResponse.FromString(base64.b64decode(record["answer"]))
        # A write commits with its record, so the record's revision is the write's epoch.
        answer.epoch = entry.mod_revision if record["wrote"] else record["epoch"]
        return answer


def check_config_size(size: int, limit: int, what: str, refusal: type[SieError] = InvalidArgument) -> None:
    """CONFIG_TOO_LARGE over SIE_MAX_MODEL_CONFIG_BYTES: before etcd, which would refuse it as an outage."""
    if size > limit:
        raise refusal(
            f"{what} is {size} bytes; a model config is at most {limit} bytes (SIE_MAX_MODEL_CONFIG_BYTES): shorten "
            "its options, or split its profiles over several model ids",
            reason="CONFIG_TOO_LARGE",
            metadata={"size_bytes": str(size), "limit_bytes": str(limit)},
        )


def request_fingerprint(request: config_pb2.AddModelRequest) -> str:
    return hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()


def _idempotency_record(answer: config_pb2.AddModelResponse, fingerprint: str, *, wrote: bool, epoch: int) -> bytes:
    record = {
        "fingerprint": fingerprint,
        "answer": base64.b64encode(answer.SerializeToString()).decode(),
        "wrote": wrote,
        "epoch": epoch,
    }
    return json.dumps(record).encode()


def _merge(stored: ModelConfig | None, request: ModelConfig) -> tuple[ModelConfig, config_pb2.AddModelResponse]:
    """The stored config with the request's new profiles added, and the answer that describes it."""
    answer = config_pb2.AddModelResponse(model=request.id)
    if stored is None:
        answer.created = True
        answer.added_profiles.extend(sorted(request.profiles))
        return request, answer
    old, new = stored.to_dict(), request.to_dict()
    old_profiles, new_profiles = old.pop("profiles"), new.pop("profiles")
    if old != new:
        fields = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
        raise FailedPrecondition(
            f"model {request.id!r} exists with different {', '.join(fields)}; configs are append-only by profile, "
            "so a new model-level setting needs a new model id",
            reason="MODEL_METADATA_CONFLICT",
            metadata={"model": request.id, "fields": ",".join(fields)},
        )
    for name, profile in sorted(new_profiles.items()):
        if name not in old_profiles:
            answer.added_profiles.append(name)
        elif old_profiles[name] == profile:
            answer.skipped_profiles.append(name)
        else:
            raise AlreadyExists(
                f"model {request.id!r} already has a profile {name!r} with different settings; "
                "profiles are append-only, so add the change under a new profile name",
                reason="PROFILE_CONFLICT",
                metadata={"model": request.id, "profile": name},
            )
    merged = dataclasses.replace(stored, profiles={**stored.profiles, **request.profiles})
    # A new profile may extend a stored one: validate the result as a whole.
    return parse_model_config(merged.to_dict(), source=f"model {request.id!r} with the new profiles"), answer
