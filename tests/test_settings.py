"""Settings: a flag beats its SIE_* variable, which beats the default; bad values name their source."""

from __future__ import annotations

import argparse

import pytest

from sie_common.runtime.settings import SettingsError, add_flags, load_settings
from sie_worker.settings import WorkerSettings


def parse(argv: list[str], environ: dict[str, str]) -> WorkerSettings:
    parser = argparse.ArgumentParser()
    add_flags(parser, WorkerSettings)
    return load_settings(WorkerSettings, parser.parse_args(argv), environ)


def test_defaults_are_the_reference_defaults() -> None:
    settings = parse([], {})
    assert settings.port == 50061
    assert settings.max_batch_requests == 64
    assert settings.max_batch_wait_ms == 10.0
    assert settings.max_batch_tokens == 16384
    assert settings.max_concurrent_requests == 512
    assert settings.preprocessor_workers == 4
    assert settings.hf_fallback is True
    assert settings.model_filter == ()


def test_environment_overrides_default_and_flag_overrides_environment() -> None:
    environ = {"SIE_MAX_BATCH_REQUESTS": "8", "SIE_PORT": "6000", "SIE_MODEL_FILTER": "a/b, c/d", "SIE_HF_FALLBACK": "false"}
    from_env = parse([], environ)
    assert (from_env.max_batch_requests, from_env.port, from_env.model_filter, from_env.hf_fallback) == (8, 6000, ("a/b", "c/d"), False)
    from_flags = parse(["--max-batch-requests", "16", "--hf-fallback"], environ)
    assert from_flags.max_batch_requests == 16
    assert from_flags.hf_fallback is True
    assert from_flags.port == 6000


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="SIE_MAX_BATCH_WAIT_MS='soon'"):
        parse([], {"SIE_MAX_BATCH_WAIT_MS": "soon"})
    with pytest.raises(SettingsError, match="SIE_HF_FALLBACK='maybe': expected true or false"):
        parse([], {"SIE_HF_FALLBACK": "maybe"})
    with pytest.raises(SettingsError, match="--port='http'"):
        parse(["--port", "http"], {})


@pytest.mark.parametrize("value", ["nan", "1.5", "-2"])
def test_a_minimum_cosine_outside_minus_one_to_one_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match=r"SIE_PRECISION_MIN_COSINE=.*must be a cosine"):
        parse([], {"SIE_PRECISION_MIN_COSINE": value})
