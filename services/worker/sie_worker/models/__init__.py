"""The models a worker serves: the catalog of configs, the registry that loads, holds and evicts them, their LoRA
adapters, device and memory."""
