"""An integration imported without its framework, or an image feature without pillow, fails with a
ModuleNotFoundError that names the sie-client extra to install (not a bare "No module named ..."). Each import runs in
a fresh interpreter in which the framework is made unimportable (None in sys.modules, as Python treats a package
that is not installed)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

# integration module -> (its extra, the top-level packages made unimportable)
INTEGRATIONS = {
    "chroma": ("chroma", "chromadb"),
    "haystack": ("haystack", "haystack"),
    "lancedb": ("lancedb", "lancedb"),
    "langchain": ("langchain", "langchain_core"),
    "llamaindex": ("llamaindex", "llama_index"),
    "qdrant": ("qdrant", "qdrant_client"),
}


def _import_without(module: str, missing: str) -> subprocess.CompletedProcess[str]:
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        f"try:\n    import {module}\n"
        "except ModuleNotFoundError as error:\n    print(error.name); print(error)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.process  # starts a Python of its own
@pytest.mark.parametrize("name", INTEGRATIONS)
def test_an_integration_without_its_framework_names_the_extra(name: str) -> None:
    extra, package = INTEGRATIONS[name]
    ran = _import_without(f"sie_client.integrations.{name}", package)
    assert ran.stdout.splitlines() == [
        package,
        f"sie_client.integrations.{name} needs {package}, which the client's `{extra}` extra installs: "
        f"pip install './clients/python[{extra}]' (from a checkout of SIE)",
    ], ran.stderr


def test_a_numpy_image_without_pillow_names_the_images_extra(monkeypatch) -> None:
    from sie_client.images import image_message

    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ModuleNotFoundError, match=r"\./clients/python\[images\]") as raised:
        image_message(np.zeros((4, 4, 3), dtype=np.uint8))
    assert raised.value.name == "PIL"
