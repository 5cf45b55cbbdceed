"""Request-facing helpers every service shares: error answers, request bounds and parameters, auth, answer sizes,
streams and request metrics."""
