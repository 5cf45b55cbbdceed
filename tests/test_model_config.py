"""The model config validator: accepted shapes, and errors that name file, field and problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie_common.cluster.model_config import ModelConfigError, load_model_config, parse_model_config

VALID = {
    "id": "org/model",
    "hf_id": "org/model",
    "profiles": {
        "default": {"adapter": "sentence_transformer", "max_batch_tokens": 8192, "run_options": {"query_prompt": "q: "}},
        "fast": {"extends": "default", "compute_precision": "bfloat16", "run_options": {"document_prompt": "d: "}},
    },
}


def test_profiles_inherit_through_extends() -> None:
    config = parse_model_config(VALID, source="m.yaml")
    fast = config.profile("fast")
    assert fast.adapter == "sentence_transformer"
    assert fast.max_batch_tokens == 8192
    assert fast.compute_precision == "bfloat16"
    assert fast.run_options == {"query_prompt": "q: ", "document_prompt": "d: "}
    assert config.output_types == ("dense",) and config.tasks == ("encode",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": "../etc/passwd"}, "m.yaml: id: '../etc/passwd' is not a model id"),
        ({"hf_id": None}, "m.yaml: no weights: set hf_id, path or bundled_weights"),
        ({"output_types": ["dense", "rainbow"]}, "m.yaml: output_types: 'rainbow' is not one of dense, sparse, multivector"),
        ({"dims": -1}, "m.yaml: dims: must be a positive integer, got -1"),
        ({"colour": "blue"}, "m.yaml: colour: unknown field"),
        ({"profiles": {"fast": {"adapter": "x"}}}, "m.yaml: profiles: needs a 'default' profile"),
        ({"profiles": {"default": {"max_batch_tokens": 0, "adapter": "x"}}}, "m.yaml: profiles.default.max_batch_tokens: must be a positive integer, got 0"),
        ({"profiles": {"default": {"compute_precision": "int4", "adapter": "x"}}}, "m.yaml: profiles.default.compute_precision: 'int4' is not one of"),
        ({"profiles": {"default": {"extends": "nope", "adapter": "x"}}}, "m.yaml: profiles.default.extends: no profile named 'nope'"),
        ({"profiles": {"default": {"run_options": {}}}}, "m.yaml: profiles.default.adapter: required"),
        ({"loras": ["a"]}, "m.yaml: loras: must be a mapping of adapter name to a local path or hub id"),
        ({"loras": {"bad name": "org/x"}}, "m.yaml: loras.bad name: an adapter name is letters, digits"),
        ({"loras": {"legal": 3}}, "m.yaml: loras.legal: must be a local path or hub id, got 3"),
        (
            {"profiles": {"default": {"extends": "b"}, "b": {"extends": "default"}}},
            "m.yaml: profiles.default: extends cycle: default -> b -> default",
        ),
    ],
)
def test_invalid_configs_name_file_field_and_problem(change: dict, message: str) -> None:
    with pytest.raises(ModelConfigError) as raised:
        parse_model_config({**VALID, **change}, source="m.yaml")
    assert str(raised.value).startswith(message)


def test_yaml_file_paths_resolve_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("id: local/model\npath: weights\nprofiles:\n  default:\n    adapter: sentence_transformer\n")
    config = load_model_config(tmp_path / "m.yaml")
    assert config.path == tmp_path / "weights"


def test_broken_yaml_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("id: [unclosed\n")
    with pytest.raises(ModelConfigError, match=r"bad.yaml: not valid YAML"):
        load_model_config(tmp_path / "bad.yaml")


def test_loras_resolve_local_paths_and_keep_hub_ids(tmp_path: Path) -> None:
    (tmp_path / "adapters" / "legal").mkdir(parents=True)
    (tmp_path / "m.yaml").write_text(
        "id: local/model\npath: weights\nloras:\n  legal: adapters/legal\n  medical: org/medical-lora\n"
        "profiles:\n  default:\n    adapter: sentence_transformer\n"
    )
    config = load_model_config(tmp_path / "m.yaml")
    assert config.loras == {"legal": str(tmp_path / "adapters" / "legal"), "medical": "org/medical-lora"}
    assert config.to_dict()["loras"] == dict(config.loras)
