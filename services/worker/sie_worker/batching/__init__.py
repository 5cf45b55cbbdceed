"""Forming batches: the BatchFormer (fair queuing over batch keys), each model's adaptive batch policy, and the
statistics of each forward pass."""
