"""Reading the files a checkpoint directory holds beside its weights (configs, sentence-transformers modules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def read_modules(directory: Path) -> list[dict[str, Any]]:
    """The entries of the directory's sentence-transformers `modules.json` ([] without one); ValueError when it
    is not a list of objects, each with a string `type` and `path`."""
    path = directory / "modules.json"
    if not path.exists():
        return []
    entries = json.loads(path.read_text())
    if not isinstance(entries, list) or not all(
        isinstance(entry, dict) and isinstance(entry.get("type"), str) and isinstance(entry.get("path", ""), str)
        for entry in entries
    ):
        raise ValueError(f"{path}: not a list of modules, each with a string type and path")
    return entries


def module_folder(directory: Path, relative: str) -> Path:
    """`directory / relative` for a folder the checkpoint's own files name (modules.json, a Router's config).
    ValueError where it leads out of the directory ('..', an absolute path, a symlink): the weight roots were
    checked for the directory, not for what its files point at."""
    folder = directory / relative
    inside = directory.resolve()
    if folder.resolve() != inside and inside not in folder.resolve().parents:
        raise ValueError(f"{directory}: module path {relative!r} leads out of the model directory")
    return folder
