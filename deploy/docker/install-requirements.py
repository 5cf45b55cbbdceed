"""Install the third-party requirements of the distributions named, in the versions of constraints.txt: an image's
dependency layer.

    python3 install-requirements.py lib services/worker[gliner,gliclass]

Run in a Dockerfile with only the pyproject.toml files copied, so the layer that installs the dependencies
(torch, transformers, grpcio...) is rebuilt when a pyproject.toml changes, not with every change of the code.
The repository's own distributions (sie-*) are left out: the code layer installs them with --no-deps.
Standard library only: it runs on the image's bare Python.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

OWN = re.compile(r"^sie-[a-z]+\b")


def requirements(folder: str) -> list[str]:
    """`folder`'s [project] dependencies and those of the extras named in brackets (`services/worker[gliner]`)."""
    path, _, extras = folder.partition("[")
    project = tomllib.loads((Path(path) / "pyproject.toml").read_text())["project"]
    found = list(project.get("dependencies", []))
    for extra in filter(None, extras.rstrip("]").split(",")):
        found += project["optional-dependencies"][extra.strip()]
    return [requirement for requirement in found if not OWN.match(requirement)]


def main(folders: list[str]) -> int:
    if not folders:
        print(__doc__, file=sys.stderr)
        return 2
    wanted = list(dict.fromkeys(requirement for folder in folders for requirement in requirements(folder)))
    if not wanted:
        print(f"install-requirements: {' '.join(folders)}: nothing beyond the repository's own distributions")
        return 0
    return subprocess.call([sys.executable, "-m", "pip", "install", "-c", "constraints.txt", *wanted])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
