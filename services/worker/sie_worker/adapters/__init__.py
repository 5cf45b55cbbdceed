"""Model adapters: the one contract the engine runs every model by (contract.py), what a family serves (spec.py),
the families (families/, one module each), the Hugging Face set-up they share (hf.py) and their helpers (layers/).

ADAPTERS: each family's adapter class by the name model profiles give in `adapter:`."""

from sie_worker.adapters.families import FAMILIES as ADAPTERS

__all__ = ["ADAPTERS"]
