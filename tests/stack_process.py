"""Stopping a `sie up` the tests started, as a person would (Ctrl-C), and then anything it left behind."""

from __future__ import annotations

import signal
import subprocess

import psutil


def stop_stack(process: subprocess.Popen, timeout_s: float = 120) -> None:
    """SIGINT to `sie up`; kill it past `timeout_s`, and kill any of its children still running after it."""
    children = psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
    for child in children:
        if child.is_running():
            child.kill()


class SieUp:
    """A `sie up` the tests started, for `Services.keep`: stopped as a person would (`stop_stack`)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def stop(self) -> None:
        stop_stack(self.process)
