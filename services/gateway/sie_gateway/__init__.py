"""The gateway: the stateless edge that routes public calls to workers."""
