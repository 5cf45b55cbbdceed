"""Cluster state: etcd and its mirrors, the stores of workers and configs, bundles and model configs."""
