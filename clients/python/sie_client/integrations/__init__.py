"""Framework adapters on top of SIEClient (each needs its framework installed)."""
