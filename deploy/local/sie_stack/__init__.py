"""The whole engine on one machine: `sie up` starts etcd, the config service, workers, the gateway and Envoy."""
