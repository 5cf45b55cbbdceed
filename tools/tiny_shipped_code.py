"""Copies of tiny replicas whose shipped code files (the modules a config's `auto_map` names) are tripwires: each
records that it ran (writes TRIPWIRE in the copy) and then fails, so a model served from the copy shows whether any
code shipped with the weights ran."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

TRIPWIRE = "tripwire.txt"


def tripwire_copy(directory: Path, copy: Path, code_files: Iterable[str]) -> Path:
    """`directory` copied to `copy`, `code_files` written as tripwires beside every config.json in it."""
    shutil.copytree(directory, copy)
    names = list(code_files)
    for folder in {path.parent for path in copy.rglob("config.json")}:
        for name in names:
            (folder / name).write_text(
                f"import pathlib\npathlib.Path({str(copy / TRIPWIRE)!r}).write_text('ran')\n"
                "raise ValueError('the shipped code ran')\n"
            )
    return copy
