"""A service process's runtime: settings, logging, tracing, the metrics and gRPC servers, transport (TLS) and the
service command line."""
