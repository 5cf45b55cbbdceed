"""transformers' and peft's from_pretrained are not safe to run in two threads at once (meta-device initialisation
is process-wide): model and LoRA loads take turns on this lock."""

from __future__ import annotations

import threading

LOAD_LOCK = threading.Lock()
