"""JSON log lines turn Hugging Face's progress bars off, also in a process that imported huggingface_hub and
transformers before it configured its logging (they read HF_HUB_DISABLE_PROGRESS_BARS once, at import): a
service forked after its imports, as the test suite's are."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import huggingface_hub.utils
import pytest
import transformers.utils.logging

from sie_common.runtime.logs import configure_logging


@pytest.fixture
def bars_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Progress bars on (no HF_HUB_DISABLE_PROGRESS_BARS), and this process's logging as it was afterwards."""
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    huggingface_hub.utils.enable_progress_bars()
    transformers.utils.logging.enable_progress_bar()
    yield
    root.handlers[:], root.level = handlers, level
    logging.captureWarnings(False)
    huggingface_hub.utils.enable_progress_bars()
    transformers.utils.logging.enable_progress_bar()


def test_json_lines_turn_off_the_bars_of_libraries_imported_already(bars_on: None) -> None:
    assert not huggingface_hub.utils.are_progress_bars_disabled()
    configure_logging("info", json_lines=True)
    assert huggingface_hub.utils.are_progress_bars_disabled()
    assert not transformers.utils.logging.is_progress_bar_enabled()


def test_text_lines_and_an_explicit_0_leave_them_on(bars_on: None, monkeypatch: pytest.MonkeyPatch) -> None:
    configure_logging("info", json_lines=False)
    assert not huggingface_hub.utils.are_progress_bars_disabled()
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    configure_logging("info", json_lines=True)
    assert not huggingface_hub.utils.are_progress_bars_disabled()
    assert transformers.utils.logging.is_progress_bar_enabled()
