"""What `make images` leaves in the images besides the services: none of pip's build settings (they come as a build
secret; an outside attack read the mirror, find-links and CA bundle of every image with `podman history --no-trunc`
when they were build arguments), and the user and group every image runs as (uid and gid 10001, the owner of the
worker's weight cache; the group was missing and the cache's owner a bare number)."""

from __future__ import annotations

import subprocess

import pytest

from container_images import ROOT, build_images, engine_or_skip
from sie_stack.containers import IMAGE_VERSION, IMAGES

pytestmark = [pytest.mark.process, pytest.mark.slow]

ENGINE = engine_or_skip()
# pip's build settings and the keys of a pip config file for them.
PIP_SETTINGS = {
    "PIP_INDEX_URL": "index-url",
    "PIP_EXTRA_INDEX_URL": "extra-index-url",
    "PIP_FIND_LINKS": "find-links",
    "PIP_CERT": "cert",
}
STANDIN = f"sie-standin-etcd:{IMAGE_VERSION}"


@pytest.fixture(scope="module")
def images() -> list[str]:
    """Built with this machine's pip configuration (file:// find-links and indexes where it has them: no network)."""
    build_images("standin-etcd")
    return [*IMAGES.values(), STANDIN]


def this_machines_pip_settings() -> list[str]:
    """The values build-images gives the build: this machine's pip configuration, each location alone."""
    values = []
    for key in PIP_SETTINGS.values():
        got = subprocess.run(
            ["python3", "-m", "pip", "config", "get", f"global.{key}"], capture_output=True, text=True, check=False
        )
        values += got.stdout.split() if got.returncode == 0 else []
    return values


def in_image(image: str, *command: str) -> str:
    result = subprocess.run(
        [ENGINE.binary, "run", "--rm", "--network", "none", *ENGINE.run_flags(), "--entrypoint", command[0], image,
         *command[1:]],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{image}: {command}: {result.stderr}"
    return result.stdout.strip()


def test_no_pip_build_setting_is_in_any_image_history_or_file(images) -> None:
    settings = this_machines_pip_settings()
    assert settings, "this machine has no pip settings to look for (the check would prove nothing)"
    for image in images:
        history = subprocess.run(
            [ENGINE.binary, "history", "--no-trunc", "--format", "{{.CreatedBy}} {{.Comment}}", image],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "--mount=type=secret,id=pip.conf" in history or image == STANDIN, image
        leaked = [name for name in PIP_SETTINGS if name in history] + [value for value in settings if value in history]
        assert leaked == [], f"{image}: its history records {leaked}"
        environment = in_image(image, "env")
        assert not [name for name in PIP_SETTINGS if name in environment], image
        # The secret was mounted for the steps that install and is not in any layer.
        assert (
            in_image(image, "sh", "-c", "ls /etc/pip.conf /etc/xdg/pip /opt/venv/pip.conf 2>&1 || true").count(
                "No such file"
            )
            == 3
        ), image


def test_every_image_runs_as_user_and_group_10001_and_the_weight_cache_is_theirs(images) -> None:
    for image in IMAGES.values():
        assert in_image(image, "id") == "uid=10001(sie) gid=10001(sie) groups=10001(sie)", image
    worker = IMAGES["sie_worker"]
    assert in_image(worker, "stat", "-c", "%u:%g %U:%G %a", "/var/cache/sie") == "10001:10001 sie:sie 755"
    assert in_image(worker, "sh", "-c", "touch /var/cache/sie/probe && echo written") == "written"


def test_each_image_holds_this_checkouts_code(images) -> None:
    """The install step reruns when the code changes: buildah caches a RUN without looking into its bind mount, and
    kept the old code after a change (build-images passes a digest of the files as SOURCE_DIGEST)."""
    for module, image in IMAGES.items():
        if module == "envoy":
            continue
        files = {
            f"{module}.settings": f"services/{module.removeprefix('sie_')}/{module}/settings.py",
            "sie_common.runtime.settings": "lib/sie_common/runtime/settings.py",
        }
        for name, path in files.items():
            installed = in_image(image, "python", "-c", f"import {name} as m; print(m.__file__)")
            assert in_image(image, "cat", installed) == (ROOT / path).read_text().strip(), f"{image}: {path} is stale"
