"""The worker: batches items onto a device and runs the models."""
