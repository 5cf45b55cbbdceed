"""The reliability suite: faults, load, hostile input, fuzzing and security, with a printed summary."""
