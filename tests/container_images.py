"""The images `make images` builds, for the tests that run them: the container engine (the tests skip where none
works) and a build from the layer cache (quick when nothing changed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sie_stack.containers import IMAGES, ContainerEngine

ROOT = Path(__file__).resolve().parents[1]
BUILD_TARGETS = ("config", "gateway", "worker-cpu", "envoy")
BUILD_TIMEOUT_S = 3600


def engine_or_skip() -> ContainerEngine:
    """The engine, or skip the module saying why there is none."""
    try:
        return ContainerEngine.find()
    except RuntimeError as error:
        pytest.skip(f"the images run only where a container engine works ({error})", allow_module_level=True)
        raise


def build_images(*extra: str) -> list[str]:
    """`deploy/docker/build-images` for the images the stack and the manifests run, and the `extra` targets; the
    stack's tags."""
    built = subprocess.run(
        [str(ROOT / "deploy" / "docker" / "build-images"), *BUILD_TARGETS, *extra],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return list(IMAGES.values())
