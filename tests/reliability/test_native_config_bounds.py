"""Odd or hostile config.json values in checkpoints served natively on transformers' classes
(sie_worker.adapters.layers.native_architectures): each fails the load with a ValueError that names the key (a
permanent MODEL_LOAD_FAILED), before any model is built. Found by the outside attack on h36-natives:

- a rope factor or base whose product overflows a float loaded and served vectors on an infinite rotary base (the
  shipped code cannot even build that model); a factor of `true` was taken as 1;
- a zero, negative, missing-but-scaled, string or float size died in the translation with ZeroDivisionError,
  KeyError or a RuntimeError the registry retried forever, none naming the key;
- a num_hidden_layers of a million over a two-layer checkpoint built a million layers before finding their weights
  missing: minutes and gigabytes, holding the load lock (every other model's load waited behind it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sie_worker.adapters.layers.native_architectures import native_architecture
from sie_worker.models.load_errors import is_permanent
from tiny_gte import build_gte
from tiny_jina import build_jina_reranker

MULTILINGUAL = "Alibaba-NLP/gte-multilingual-base"
NTK = {"type": "ntk", "factor": 2.0}


@pytest.fixture(scope="module")
def gte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gte(tmp_path_factory.mktemp("gte"), MULTILINGUAL).shipped


@pytest.fixture(scope="module")
def jina(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_jina_reranker(tmp_path_factory.mktemp("jina")).shipped


def _config(directory: Path, **change: Any) -> dict[str, Any]:
    config = json.loads((directory / "config.json").read_text())
    for key, value in change.items():
        if value is _MISSING:
            config.pop(key, None)
        else:
            config[key] = value
    return config


_MISSING = object()


def assert_refused(raw: dict[str, Any], model_type: str, named: str) -> None:
    """The config is served natively as `model_type`, and its translation refuses it (permanently) naming `named`."""
    native = native_architecture(raw)
    assert native is not None and native.model_type == model_type
    with pytest.raises(ValueError, match=named) as refused:
        native.loader(raw)
    assert is_permanent(refused.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"rope_scaling": {"type": "ntk", "factor": 1e305}}, "past a float's range"),
        ({"rope_theta": 1e308, "rope_scaling": {"type": "ntk", "factor": 10}}, "past a float's range"),
        ({"rope_scaling": {"type": "ntk", "factor": True}}, "rope_scaling"),
        ({"rope_theta": True}, "rope_theta"),
        ({"rope_theta": 10**400}, "rope_theta"),
        ({"rope_scaling": {"type": "ntk", "factor": 10**400}}, "rope_scaling"),
        ({"rope_theta": "abc"}, "rope_theta"),
        ({"rope_theta": None}, "rope_theta"),
        ({"rope_theta": [1]}, "rope_theta"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"num_attention_heads": 0, "rope_scaling": NTK}, "num_attention_heads"),
        ({"num_attention_heads": -2}, "num_attention_heads"),
        ({"num_attention_heads": "2"}, "num_attention_heads"),
        ({"num_attention_heads": 3}, "num_attention_heads"),
        ({"hidden_size": 32.0}, "hidden_size"),
        ({"hidden_size": 0, "rope_scaling": NTK}, "hidden_size"),
    ],
    ids=[
        "factor-overflows",
        "base-times-factor-overflows",
        "factor-true",
        "base-true",
        "base-an-integer-past-floats",
        "factor-an-integer-past-floats",
        "base-a-word",
        "base-null",
        "base-a-list",
        "no-heads",
        "no-heads-scaled",
        "negative-heads",
        "heads-a-string",
        "heads-not-dividing",
        "width-a-float",
        "no-width-scaled",
    ],
)
def test_an_odd_gte_setting_is_refused_naming_its_key(gte: Path, change: dict[str, Any], named: str) -> None:
    assert_refused(_config(gte, **change), "gte", named)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"num_attention_heads": 3}, "num_attention_heads"),
        ({"pad_token_id": 10**9}, "pad_token_id"),
        ({"pad_token_id": -1}, "pad_token_id"),
    ],
    ids=["no-heads", "heads-not-dividing", "padding-past-the-vocabulary", "negative-padding"],
)
def test_an_odd_jina_setting_is_refused_naming_its_key(jina: Path, change: dict[str, Any], named: str) -> None:
    """A padding token past the vocabulary failed in torch with an AssertionError, which the registry retried for
    ever (MODEL_LOAD_BACKOFF); no heads with a ZeroDivisionError."""
    assert_refused(_config(jina, **change), "xlm-roberta", named)


def test_a_missing_size_is_the_native_default(gte: Path) -> None:
    """A config without hidden_size (and no rope scaling) still reads as GteConfig's and NewConfig's 768."""
    raw = _config(gte, hidden_size=_MISSING, rope_scaling=None)
    native = native_architecture(raw)
    assert native is not None
    assert native.loader(raw).config.hidden_size == 768


_LOAD = """
import json, sys
from pathlib import Path
from sie_worker.adapters.layers.native_architectures import native_architecture
directory = Path(sys.argv[1])
raw = json.loads(sys.argv[2])
try:
    native_architecture(raw).loader(raw).from_pretrained(directory)
except ValueError as error:
    print("REFUSED", error)
else:
    print("LOADED")
"""


@pytest.mark.process
@pytest.mark.parametrize("replica", ["gte", "jina"])
def test_more_layers_than_the_weights_hold_is_refused_before_building(
    replica: str, request: pytest.FixtureRequest
) -> None:
    """Run in a process of its own, so that the build this refusal prevents (minutes) is killed, not waited for."""
    directory: Path = request.getfixturevalue(replica)
    raw = _config(directory, num_hidden_layers=1_000_000)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD, str(directory), json.dumps(raw)],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the load of a million-layer config over a two-layer checkpoint was still building after 90 s")
    assert "REFUSED" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "num_hidden_layers is 1000000" in done.stdout and "hold 2 layers" in done.stdout
    assert time.monotonic() - started < 90


def test_the_layers_a_checkpoint_holds_still_load(gte: Path) -> None:
    raw = _config(gte)
    native = native_architecture(raw)
    assert native is not None
    model = native.loader(raw).from_pretrained(gte)
    layers: Any = model.layers  # GteModel's
    assert len(layers) == raw["num_hidden_layers"] == 2
