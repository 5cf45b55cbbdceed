"""The Kubernetes base turns etcd authentication on, and every service signs in with the user the Job made.

The Job `sie-etcd-access` creates etcd's users from Secrets; each engine
container names one of those users and mounts the Secret holding its
password. Checked on the rendered overlays, then for real: the Job's command
with the Job's environment against a real etcd, and each service's client
with its container's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from manifests import OVERLAYS
from sie_common.cluster.etcd import Etcd, EtcdAccessDenied
from sie_common.cluster.etcd_access import ROOT_USER, AccessSettings
from sie_common.runtime.settings import load_settings
from sie_stack.processes import EtcdProcess
from test_manifests import env_of, one, our_containers, rendered  # noqa: F401 - rendered is a fixture

# Starts processes (an etcd of its own and kustomize) in fixtures of its own.
pytestmark = pytest.mark.process

# What each service's role must be able to write, and something it must not.
MAY_WRITE = {"ConfigSettings": "models/m", "GatewaySettings": "pools/p", "WorkerSettings": "workers/w"}
MAY_NOT_WRITE = {"ConfigSettings": "workers/w", "GatewaySettings": "models/m", "WorkerSettings": "models/m"}


def job_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(objects, "Job", "sie-etcd-access")["spec"]["template"]["spec"]["containers"]
    return container


def job_secrets(container: dict[str, Any]) -> dict[str, str]:
    """The Job's variable -> the Secret it reads it from."""
    return {var["name"]: var["valueFrom"]["secretKeyRef"]["name"] for var in container["env"] if "valueFrom" in var}


def users_by_secret(container: dict[str, Any]) -> dict[str, str]:
    """Which etcd user each Secret holds the password of: the Job's settings, with each password set to the name
    of the Secret it comes from."""
    settings = load_settings(AccessSettings, environ=job_secrets(container))
    return {settings.root_password: ROOT_USER} | {user.password: user.name for user in settings.users()}


def mounted_password(workload: dict[str, Any], container: dict[str, Any]) -> tuple[str, int]:
    """The Secret a container's SIE_ETCD_PASSWORD_FILE comes from, and the file's mode."""
    path = Path(env_of(container)["SIE_ETCD_PASSWORD_FILE"])
    (mount,) = [m for m in container["volumeMounts"] if path.parent == Path(m["mountPath"])]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert path.name == "password", "the file is the Secret's key"
    return volume["secret"]["secretName"], volume["secret"]["defaultMode"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_signs_in_as_the_user_the_job_makes_from_the_secret_it_mounts(rendered, overlay: str) -> None:  # noqa: F811
    objects = rendered[overlay]
    job = job_container(objects)
    assert job["command"] == ["python", "-m", "sie_common.cluster.etcd_access"]
    users = users_by_secret(job)
    assert sorted(users.values()) == ["root", "sie-config", "sie-gateway", "sie-worker"]
    signed_in = set()
    for workload, container, settings in our_containers(objects):
        where = f"{overlay} {workload['metadata']['name']}"
        env = env_of(container)
        assert "SIE_ETCD_PASSWORD" not in env, f"{where}: the password comes from the mounted Secret"
        secret, mode = mounted_password(workload, container)
        assert users[secret] == env["SIE_ETCD_USERNAME"] != "root", where
        assert mode & 0o007 == 0, f"{where}: the password file must not be world-readable"
        assert workload["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001, where
        signed_in.add(settings.__name__)
    assert signed_in == {"ConfigSettings", "GatewaySettings", "WorkerSettings"}
    # etcd admits the Job's pods.
    policy = one(objects, "NetworkPolicy", "sie-etcd")
    job_labels = one(objects, "Job", "sie-etcd-access")["spec"]["template"]["metadata"]["labels"]
    (selector,) = [
        e
        for e in policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
        if e["key"] == "app.kubernetes.io/component"
    ]
    assert job_labels["app.kubernetes.io/component"] in selector["values"]


async def test_the_jobs_users_let_each_service_write_only_its_own_keys(rendered, tmp_path: Path) -> None:  # noqa: F811
    """The Job's command with the Job's environment (each Secret a fresh password) on a real etcd; then each
    service's etcd client, built from its container's environment, against it."""
    objects = rendered["local"]
    job = job_container(objects)
    passwords = {secret: f"password-of-{secret}" for secret in job_secrets(job).values()}
    server = EtcdProcess(tmp_path / "etcd", tmp_path / "etcd.log")
    server.start()
    try:
        env = {name: passwords[secret] for name, secret in job_secrets(job).items()}
        env |= {var["name"]: var["value"] for var in job["env"] if "value" in var}
        env["SIE_ETCD_ENDPOINTS"] = server.endpoint
        outside = {key: value for key, value in os.environ.items() if not key.startswith("SIE_")}
        for run in range(2):  # it is idempotent: a second run finds authentication on and changes nothing
            result = subprocess.run(
                [sys.executable, *job["command"][1:]],
                env={**outside, **env},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, result.stderr
            assert not any(password in result.stderr for password in passwords.values())
        for workload, container, settings in our_containers(objects):
            service_env = env_of(container)
            secret, _ = mounted_password(workload, container)
            password_file = tmp_path / secret
            password_file.write_text(passwords[secret] + "\n")
            service_env |= {"SIE_ETCD_ENDPOINTS": server.endpoint, "SIE_ETCD_PASSWORD_FILE": str(password_file)}
            service_settings = load_settings(
                settings, environ={k: v.replace("$(POD_IP)", "10.0.0.7") for k, v in service_env.items()}
            )
            etcd = Etcd.from_settings(service_settings)
            await etcd.connect()
            try:
                await etcd.put(MAY_WRITE[settings.__name__], b"x")
                with pytest.raises(EtcdAccessDenied):
                    await etcd.put(MAY_NOT_WRITE[settings.__name__], b"x")
            finally:
                await etcd.close()
    finally:
        server.stop()
