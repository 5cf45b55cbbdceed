"""The worker in a cluster: its model configs kept in sync from etcd, and its registration there."""
