"""The fault, load, hostile-input and fuzzing suite (see docs/reliability.md)."""
