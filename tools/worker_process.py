"""Service launchers for tests and benchmarks (they live in sie_stack, which `sie up` uses too)."""

from sie_stack.processes import ServiceProcess as WorkerProcess
from sie_stack.processes import free_port

__all__ = ["WorkerProcess", "free_port"]
