"""The etcd launcher for tests and benchmarks (it lives in sie_stack, which `sie up` uses too)."""

from sie_stack.processes import EtcdProcess

__all__ = ["EtcdProcess"]
