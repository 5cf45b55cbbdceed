"""A gateway sends SIE_WORKER_TOKEN only to workers it can authenticate: registered through an etcd with
authentication on (the gateway has its own etcd credential) or holding a certificate from SIE_WORKER_TLS_CA_FILE."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sie_common.runtime.settings import SettingsError, load_settings
from sie_gateway.settings import GatewaySettings


@pytest.mark.parametrize(
    ("env", "starts"),
    [
        ({}, True),  # no worker token: nothing to leak
        ({"SIE_WORKER_TOKEN": "t"}, False),  # anyone who reaches etcd could register a worker and get it
        ({"SIE_WORKER_TOKEN": "t", "SIE_ETCD_USERNAME": "sie-gateway", "SIE_ETCD_PASSWORD": "p"}, True),
        ({"SIE_WORKER_TOKEN": "t", "SIE_WORKER_TLS_CA_FILE": "/ca.pem"}, True),
        ({"SIE_WORKER_TOKEN": "t", "SIE_ALLOW_UNAUTHENTICATED_WORKERS": "true"}, True),
    ],
)
def test_a_worker_token_needs_a_way_to_authenticate_workers(env: dict[str, str], starts: bool) -> None:
    if starts:
        assert load_settings(GatewaySettings, environ=env).worker_token == env.get("SIE_WORKER_TOKEN")
    else:
        with pytest.raises(SettingsError, match="nothing authenticates the workers") as refused:
            load_settings(GatewaySettings, environ=env)
        assert "SIE_ETCD_USERNAME" in str(refused.value) and "SIE_WORKER_TLS_CA_FILE" in str(refused.value)


@pytest.mark.process  # starts a gateway
def test_the_gateway_refuses_to_start_and_says_why() -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SIE_")}
    result = subprocess.run(
        [sys.executable, "-m", "sie_gateway", "serve"],
        env={**env, "SIE_WORKER_TOKEN": "secret-worker-token"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "nothing authenticates the workers it would be sent to" in result.stderr
    assert "secret-worker-token" not in result.stderr
