"""Bundles: parsing, which models they serve, and hashes that move when served config moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie_common.cluster.bundles import Bundle, BundleHashes, bundle_config_hash, bundle_set_hash, load_bundles, parse_bundle
from sie_common.cluster.model_config import ModelConfigError, parse_model_config
from sie_worker.adapters import ADAPTERS

ROOT = Path(__file__).resolve().parents[1]


def model(model_id: str, adapter: str = "sentence_transformer", dims: int | None = None):
    data = {"id": model_id, "hf_id": model_id, "profiles": {"default": {"adapter": adapter}}}
    if dims:
        data["dims"] = dims
    return parse_model_config(data, source="test")


def test_the_repository_bundles_load() -> None:
    bundles = load_bundles(ROOT / "bundles")
    assert "default" in bundles
    # The default image runs every adapter of this repository's worker.
    assert set(bundles["default"].adapters) == set(ADAPTERS)


def test_a_bundle_serves_models_by_adapter_and_optional_list() -> None:
    by_adapter = Bundle("a", ("sentence_transformer",))
    listed = Bundle("b", ("sentence_transformer",), models=("x/one",))
    assert by_adapter.can_serve(model("x/one")) and by_adapter.can_serve(model("x/two"))
    assert not by_adapter.can_serve(model("x/three", adapter="gliner"))
    assert listed.can_serve(model("x/one")) and not listed.can_serve(model("x/two"))


def test_excluded_models_are_left_to_another_bundle() -> None:
    bundle = parse_bundle({"id": "a", "adapters": ["sentence_transformer"], "exclude_models": ["x/large"]}, source="a.yaml")
    assert bundle.can_serve(model("x/small")) and not bundle.can_serve(model("x/large"))
    # Round trip through the etcd form; a bundle without exclusions keeps its former form (and hashes).
    assert parse_bundle(bundle.to_dict(), source="etcd") == bundle
    assert "exclude_models" not in Bundle("b", ("sentence_transformer",)).to_dict()
    with pytest.raises(ModelConfigError, match="a.yaml: exclude_models: must be a list of model ids"):
        parse_bundle({"id": "a", "adapters": ["x"], "exclude_models": "x/large"}, source="a.yaml")


def test_config_hash_follows_the_served_configs_only() -> None:
    bundle = Bundle("a", ("sentence_transformer",))
    base = bundle_config_hash(bundle, [model("x/one")])
    assert bundle_config_hash(bundle, [model("x/one")]) == base
    assert bundle_config_hash(bundle, [model("x/one"), model("x/two")]) != base
    assert bundle_config_hash(bundle, [model("x/one", dims=8)]) != base
    assert bundle_config_hash(bundle, [model("x/one"), model("x/other", adapter="gliner")]) == base
    assert bundle_set_hash([bundle]) != bundle_set_hash([bundle, Bundle("b", ("gliner",))])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"adapters": ["x"]}, "b.yaml: id: required"),
        ({"id": "b"}, "b.yaml: adapters: required"),
        ({"id": "b", "adapters": ["x"], "priority": "high"}, "b.yaml: priority: must be an integer"),
        ({"id": "b", "adapters": ["x"], "gpu": "l4"}, "b.yaml: gpu: unknown field"),
        # An empty value of the wrong kind is no list either (it used to read as "none").
        ({"id": "b", "adapters": ["x"], "exclude_models": {}}, "b.yaml: exclude_models: must be a list of model ids"),
        ({"id": "b", "adapters": ["x"], "exclude_models": ""}, "b.yaml: exclude_models: must be a list of model ids"),
        ({"id": "b", "adapters": ["x"], "models": 0}, "b.yaml: models: must be a list of model ids"),
        ({"id": "b", "adapters": ["x"], "models": ["x/m"], "exclude_models": ["x/m"]}, "b.yaml: exclude_models: lists 'x/m', which models lists too"),
    ],
)
def test_bad_bundles_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(ModelConfigError) as raised:
        parse_bundle(data, source="b.yaml")
    assert str(raised.value).startswith(message)


def test_hashes_kept_change_by_change_equal_the_hash_of_the_whole() -> None:
    default = Bundle("default", ("sentence_transformer",))
    gliner = Bundle("gliner", ("gliner",), priority=1)
    hashes = BundleHashes()
    hashes.put_bundle(default)
    hashes.put_model(model("x/one"))
    hashes.put_model(model("x/two"))
    hashes.put_model(model("x/ner", adapter="gliner"))
    hashes.put_bundle(gliner)
    hashes.put_model(model("x/one", dims=8))  # replaced: its old digest leaves the sum
    hashes.remove_model("x/two")
    hashes.remove_model("x/never-added")
    configs = [model("x/one", dims=8), model("x/ner", adapter="gliner")]
    assert hashes.hashes() == {bundle.id: bundle_config_hash(bundle, configs) for bundle in (default, gliner)}
    hashes.remove_bundle("gliner")
    assert hashes.hash("gliner") is None and hashes.hash("default") == bundle_config_hash(default, configs)
