"""`sie up --images`: the stack's services run from their images (`make images`) instead of this Python.

Each service, and Envoy, is one container on the host's network, so it listens on the same loopback ports as the
process it replaces, and the stack checks and stops it the same way: the container's `run` command is the child process
(it passes SIGTERM and SIGINT on to the service and exits with its code), and the container is removed when it stops.
etcd stays a process of this machine (the manifests run the upstream etcd image). A container gets the `SIE_*`
variables a process would (the stack's, and those of the environment `sie up` runs in), no others. A file a variable
names (etcd's CA, the client certificate and key, the etcd password file) is copied into a folder of that container's
under `<state dir>/containers/` (mode 0700; the folder inside it and the copies readable by the image's unprivileged
user) and mounted at /run/sie.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from sie_stack.envoy_config import WORKER_THREADS
from sie_stack.processes import ChildProcess, EnvoyProcess, ServiceProcess

# What `make images` tags each image (deploy/docker/build-images): the distributions' version.
IMAGE_VERSION = version("sie-stack")
IMAGES = {
    "sie_config": f"sie-config:{IMAGE_VERSION}",
    "sie_gateway": f"sie-gateway:{IMAGE_VERSION}",
    "sie_worker": f"sie-worker-cpu:{IMAGE_VERSION}",
    "envoy": f"sie-envoy:{IMAGE_VERSION}",
}
# Where a container finds the files its variables name.
FILES_MOUNT = "/run/sie"
# Processes a container may start: the host's hard limit, at most this (found by trying: runc on a host whose
# `ulimit -Hu` says 96365 refused anything above 32768 with "setrlimit: operation not permitted").
MAX_PROCESSES = 32768
# A stopped container's removal (its process has exited by then).
REMOVE_TIMEOUT_S = 30


@dataclass(frozen=True)
class ContainerEngine:
    """podman or docker, with the flags every `run` needs on this host."""

    binary: str

    @classmethod
    def find(cls, name: str | None = None) -> ContainerEngine:
        """`name` (SIE_CONTAINER_ENGINE), else podman, else docker: the first installed whose `info` answers (a docker
        client without a daemon does not); RuntimeError saying what is missing otherwise."""
        tried = []
        for candidate in [name] if name else ["podman", "docker"]:
            path = shutil.which(candidate)
            if path is None:
                tried.append(f"{candidate} is not installed")
                continue
            info = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60, check=False)
            if info.returncode == 0:
                return cls(path)
            tried.append(f"`{candidate} info` failed: {(info.stderr.strip().splitlines() or ['?'])[-1]}")
        raise RuntimeError(f"no container engine works here: {'; '.join(tried)}")

    @property
    def is_podman(self) -> bool:
        return Path(self.binary).name.startswith("podman")

    def run_flags(self) -> list[str]:
        """Open files and processes at this host's hard limits (podman's defaults can exceed
        them, and the container then fails to start: "setrlimit: Operation not permitted"); with podman, runc where
        installed (crun fails on hosts with cgroups v1 in hybrid mode)."""
        files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        processes = MAX_PROCESSES if hard == resource.RLIM_INFINITY else min(hard, MAX_PROCESSES)
        flags = ["--ulimit", f"nofile={files}:{files}", "--ulimit", f"nproc={processes}:{processes}"]
        if self.is_podman and shutil.which("runc"):
            flags += ["--runtime", "runc"]
        return flags

    def missing_images(self, images: Sequence[str]) -> list[str]:
        """Those of `images` the engine does not have."""
        return [
            image
            for image in images
            if subprocess.run(
                [self.binary, "image", "inspect", image], capture_output=True, timeout=60, check=False
            ).returncode
            != 0
        ]

    def remove(self, container: str) -> None:
        """Remove the container, stopping it first if it still runs (a `run` that was killed leaves it)."""
        subprocess.run(
            [self.binary, "rm", "--force", container],
            capture_output=True,
            timeout=REMOVE_TIMEOUT_S,
            check=False,
        )


# The services need no capability and no setuid program (the Debian base still holds su, mount, passwd, ...).
UNPRIVILEGED = ("--cap-drop", "ALL", "--security-opt", "no-new-privileges")


class Container:
    """How one container is run: its name, image, the variables it gets and the files they name."""

    def __init__(self, engine: ContainerEngine, name: str, image: str, files_dir: Path) -> None:
        self.engine, self.name, self.image, self.files_dir = engine, name, image, files_dir

    def command(
        self, args: Sequence[str], env: Mapping[str, str], files: Mapping[str, Path] | None = None
    ) -> list[str]:
        """The engine's `run` command line. The files `env` names, and `files` (name in the container -> file here),
        are copied into this container's folder, mounted at FILES_MOUNT; `env` names the copies."""
        env = self._stage(env, files or {})
        return [
            self.engine.binary, "run", "--rm", "--name", self.name, "--network", "host", *self.engine.run_flags(),
            *UNPRIVILEGED,
            *(["--volume", f"{self.files_dir}:{FILES_MOUNT}:ro"] if self.files_dir.is_dir() else []),
            *[flag for key, value in env.items() for flag in ("--env", f"{key}={value}")],
            self.image, *args,
        ]  # fmt: skip

    def _stage(self, env: Mapping[str, str], files: Mapping[str, Path]) -> dict[str, str]:
        """Copy `files` and the files `env` names (absolute paths) into the container's folder; `env` with each
        such path replaced by its copy's path in the container."""
        shutil.rmtree(self.files_dir, ignore_errors=True)
        rewritten = dict(env)
        named = {f"{key.lower()}-{Path(value).name}": (key, Path(value)) for key, value in env.items()
                 if os.path.isabs(value) and os.path.isfile(value)}  # fmt: skip
        copies = {**{name: source for name, (_, source) in named.items()}, **files}
        if copies:
            self.files_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.files_dir.parent, 0o700)  # nobody else on this host reaches the copies
            self.files_dir.mkdir(mode=0o755)
        for name, source in copies.items():
            shutil.copyfile(source, self.files_dir / name)
            os.chmod(self.files_dir / name, 0o644)  # the image's user (uid 10001) is not this one
        for name, (key, _) in named.items():
            rewritten[key] = f"{FILES_MOUNT}/{name}"
        return rewritten


class ContainerProcess(ChildProcess):
    """A child process that is a container's `run`: the container is removed once it stops or is killed, and before
    it starts (again), so a `run` that was killed leaves none behind under its name."""

    container: Container

    def respawn(self) -> None:
        self.container.engine.remove(self.container.name)
        super().respawn()

    def kill(self) -> None:
        super().kill()
        self.container.engine.remove(self.container.name)

    def stop(self, timeout_s: float = 40) -> int | None:
        code = super().stop(timeout_s)
        self.container.engine.remove(self.container.name)
        return code


class ContainerServiceProcess(ContainerProcess, ServiceProcess):
    """A service (sie_config, sie_gateway, sie_worker) from its image, on the same port and with the same `SIE_*`
    variables as ServiceProcess would run it with."""

    def __init__(self, container: Container, env: Mapping[str, str], log_path: Path, module: str, port: int) -> None:
        self.container = container
        super().__init__(env, log_path, module=module, port=port)

    def _spawn(self, command: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        own = {key: value for key, value in (env or {}).items() if key.startswith("SIE_")}
        super()._spawn(self.container.command(self._argv, own))


class ContainerEnvoyProcess(ContainerProcess, EnvoyProcess):
    """Envoy from the sie-envoy image with the stack's rendered config (its descriptor set inline)."""

    def __init__(self, container: Container, config_path: Path, log_path: Path, admin_port: int) -> None:
        ChildProcess.__init__(self, log_path)  # EnvoyProcess's own start runs this machine's binary
        self.admin_port = admin_port
        self.container = container
        self._spawn(
            container.command(
                [
                    "-c", f"{FILES_MOUNT}/envoy.json", "--log-level", "warn", "--concurrency", str(WORKER_THREADS),
                    # The hot-restart socket is in the host's network namespace, where other Envoys may run.
                    "--use-dynamic-base-id", "--base-id-path", "/tmp/envoy.base-id",
                ],
                {},
                files={"envoy.json": config_path},
            )
        )  # fmt: skip


class StackContainers:
    """The containers of one `sie up --images`: named after the state dir's stack and each port, their files under
    `<state dir>/containers/`."""

    def __init__(self, engine: ContainerEngine, state: Path) -> None:
        self.engine, self.directory = engine, state / "containers"

    def check_images(self) -> None:
        """RuntimeError naming the images the engine lacks, and how to build them."""
        if missing := self.engine.missing_images(list(IMAGES.values())):
            raise RuntimeError(
                f"{self.engine.binary} has no image {', '.join(missing)}: build them with `make images` "
                "(deploy/docker/build-images)"
            )

    def _container(self, module: str, port: int) -> Container:
        name = f"sie-{module.removeprefix('sie_')}-{port}"
        return Container(self.engine, name, IMAGES[module], self.directory / name)

    def service(self, module: str, port: int, env: Mapping[str, str], log_path: Path) -> ContainerServiceProcess:
        return ContainerServiceProcess(self._container(module, port), env, log_path, module, port)

    def envoy(self, config_path: Path, log_path: Path, port: int, admin_port: int) -> ContainerEnvoyProcess:
        return ContainerEnvoyProcess(self._container("envoy", port), config_path, log_path, admin_port)

    def description(self) -> str:
        """For the banner: the images and the engine that runs them."""
        return f"{', '.join(IMAGES.values())}   ({Path(self.engine.binary).name})"
