"""The worker's gRPC APIs: the public sie.v1.Inference service and the gateway's internal Work stream.
Owns the conversion between sie.v1 messages and the engine's jobs, outcomes and model descriptions."""
