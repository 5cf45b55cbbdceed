"""Code shared by the engine's services and its Python client."""
