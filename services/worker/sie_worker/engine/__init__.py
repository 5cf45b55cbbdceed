"""The request pipeline: a job's plan (model, outputs, dims, MUVERA), tokenizing and image decoding, the device
thread, postprocessing, and the bounds a request is held to. Owns jobs, outcomes and batch keys."""
