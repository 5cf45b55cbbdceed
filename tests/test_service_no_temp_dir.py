"""A service started where no temporary directory is writable (a read-only root file system without a /tmp mount)
exits 1 with one line saying what to mount. The worker printed a traceback from transformers' import instead (an
outside attack on the images: `podman run --read-only --read-only-tmpfs=false ... sie-worker-cpu serve`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# The interpreter's own search for a temporary directory, pointed at a place nothing can write: what a read-only
# root gives every candidate (TMPDIR, /tmp, /var/tmp, /usr/tmp, the working directory).
NO_TEMP_DIR = """
import sys, tempfile
tempfile.tempdir = None
tempfile._candidate_tempdir_list = lambda: ["/proc/sie-no-temp-dir"]
from {package}.cli import main
sys.exit(main(["serve"]))
"""


@pytest.mark.parametrize("package", ["sie_worker", "sie_gateway", "sie_config"])
def test_no_writable_temp_dir_ends_the_service_with_one_line(package: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_TEMP_DIR.format(package=package)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert "No usable temporary directory" in lines[0] and "mount a writable /tmp" in lines[0], lines[0]
    assert "Traceback" not in result.stderr
