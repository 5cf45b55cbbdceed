"""The "Try:" lines `sie up` prints answer as printed: with inference tokens on (--auth-mode static) they carry the
token (read from SIE_AUTH_TOKENS in the reader's shell, never printed), and copied into a shell they get 200 from the
real stack, where the same request without it gets 401."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from sie_up_process import SieUp

# Starts processes (a `sie up` of its own) in fixtures of its own.
pytestmark = pytest.mark.process

TOKENS = "first-banner-token,second-banner-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SieUp]:
    running = SieUp.start(
        tmp_path_factory.mktemp("banner-stack"), env={"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": TOKENS}
    )
    try:
        running.wait_up()
        yield running
    finally:
        running.stop()


def try_lines(banner: str) -> list[str]:
    lines = banner.split("Try:\n", 1)[1].split("Ctrl-C stops everything.")[0].splitlines()
    return [line.strip() for line in lines if line.strip()]


def status_of(command: str, env: dict[str, str]) -> str:
    """The HTTP status of a copied curl line, run by bash in a shell with `env`."""
    ran = subprocess.run(
        ["bash", "-c", f"{command} -o /dev/null -w '%{{http_code}}'"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_the_try_lines_carry_the_token_and_answer_200(secured: SieUp) -> None:
    banner = secured.wait_up()
    lines = try_lines(banner)
    assert len(lines) == 2 and all(line.startswith("curl -s -H ") for line in lines), lines
    assert "first-banner-token" not in banner and "second-banner-token" not in banner  # not printed
    shell = {**os.environ, "SIE_AUTH_TOKENS": TOKENS}
    for line in lines:
        assert status_of(line, shell) == "200", line
        without = line.replace(' -H "authorization: Bearer ${SIE_AUTH_TOKENS%%,*}"', "")
        assert without != line and status_of(without, shell) == "401", without
