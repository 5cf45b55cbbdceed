"""A worker that other machines can reach needs a credential on its Work stream (the gateways' link, which runs any
request): SIE_WORKER_TOKEN or mutual TLS, or the explicit SIE_ALLOW_OPEN_WORK_STREAM. Its own default address is
loopback; the images listen on 0.0.0.0 and so need the token (an outside attack found a standalone worker container
open on 0.0.0.0 with no token by default). The config service refuses its open admin off loopback the same way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sie_common.runtime.settings import SettingsError
from sie_worker.settings import WorkerSettings
from worker_process import free_port


def test_the_default_address_is_loopback_and_needs_no_token() -> None:
    assert WorkerSettings().host == "127.0.0.1"
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert WorkerSettings(host=host).host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "worker.example", ""])
def test_any_other_address_without_a_credential_is_refused_naming_the_ways_out(host: str) -> None:
    with pytest.raises(SettingsError) as refused:
        WorkerSettings(host=host)
    message = str(refused.value)
    assert f"SIE_HOST={host} " in message
    for way_out in ("SIE_WORKER_TOKEN", "SIE_TLS_CLIENT_CA_FILE", "SIE_HOST=127.0.0.1", "SIE_ALLOW_OPEN_WORK_STREAM"):
        assert way_out in message


@pytest.mark.parametrize(
    "credential",
    [{"worker_token": "a-token"}, {"tls_client_ca_file": "/etc/sie/ca.pem"}, {"allow_open_work_stream": True}],
)
def test_a_token_mutual_tls_or_the_explicit_opt_in_lets_it_listen_everywhere(credential: dict[str, object]) -> None:
    assert WorkerSettings(host="0.0.0.0", **credential).host == "0.0.0.0"  # type: ignore[arg-type]


@pytest.mark.process
def test_the_worker_command_exits_2_before_loading_anything() -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SIE_")}
    env |= {"SIE_HOST": "0.0.0.0", "SIE_PORT": str(free_port()), "SIE_WORKER_METRICS_PORT": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "sie_worker", "serve"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "SIE_HOST=0.0.0.0 lets other machines reach this worker" in result.stderr
    assert "Traceback" not in result.stderr
