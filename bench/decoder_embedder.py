"""A decoder-LLM embedder replica through a standalone worker against sentence-transformers in-process.

    python bench/decoder_embedder.py [--rounds 3] [--texts 300]

The replica is Qwen3-Embedding's layout (tools/tiny_decoders.py): a random
Qwen3 decoder, 4 layers 256 wide, last-token pooling, left padding, a
byte-level BPE of 1,000 entries trained on the spot, texts cut at 128 tokens.
Both paths get the same texts (the first --texts of the harness's bulk
workload, 100 a request from 4 clients for the worker) as documents, and
take turns pass by pass: the in-process `SentenceTransformer.encode` at its
best batch size (16, 32, 64, 128 tried once), then the worker, each round.
Single-item p50 comes from one-item requests, the two paths alternating.

After the rounds, the replica's paths against the roofline of its own Linear
shapes, and what the texts would cost a real Qwen3-0.6B here
(bench/roofline.py `served`). Writes
bench/results/<date>-<arch>-<machine kind>-<cores>cores-decoder-embedder.json and the
"Decoder-LLM embedder" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import roofline
from machine import describe, slug, this_cpu
from report import replace_docs_section
from ours import InProcess, grpc_sender
from tiny_decoders import build_decoder_embedder
from tiny_models import write_config
from worker_process import WorkerProcess
from workloads import (
    Workload,
    alternating_latencies_ms,
    bulk,
    percentile,
    summary,
    throughput,
)

ROOT = Path(__file__).resolve().parents[1]

MODEL = "bench/qwen3-embedding-replica"
SHAPE = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
MAX_LENGTH = 128
SINGLE_REQUESTS = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--note", default="", help="said under the table, e.g. that the machine was shared")
    args = parser.parse_args()
    started = time.monotonic()
    load_at_start = os.getloadavg()[0]  # other work on the machine moves both paths; recorded, not corrected for
    base = bulk()
    workload = Workload("bulk", base.texts[: args.texts], base.per_request, f"{args.texts} sentences of 10-30 words (fixed seed), 100 a request")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = build_decoder_embedder(
            root / "replica",
            "qwen3",
            pooling="lasttoken",
            template="eos",
            padding_side="left",
            prompts={"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:", "document": ""},
            max_length=MAX_LENGTH,
            **SHAPE,
        )
        configs = root / "configs"
        configs.mkdir()
        write_config(configs, MODEL, f"path: {weights}\nprofiles:\n  default:\n    adapter: sentence_transformer\n")
        worker = WorkerProcess({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": MODEL, "SIE_WEIGHT_ROOTS": tmp}, root / "worker.log")
        inprocess = InProcess(weights)
        try:
            worker.wait_serving()
            served = grpc_sender(worker.address, MODEL)
            served(workload.texts[:100])  # warm-up
            batch = inprocess.best_batch_size(workload)
            rounds = []
            for _ in range(args.rounds):
                rounds.append({"in_process": inprocess.throughput(workload), "worker": throughput(served, workload)})
                print("decoder embedder: in-process %.1f items/s, worker %.1f items/s" % (rounds[-1]["in_process"], rounds[-1]["worker"]), flush=True)
            local, remote = alternating_latencies_ms([inprocess.send, served], SINGLE_REQUESTS)
            rates = {path: statistics.median(r[path] for r in rounds) for path in ("in_process", "worker")}
            base = inprocess.model[0].auto_model
            lengths = inprocess.model.preprocess(workload.texts)["attention_mask"].sum(dim=1).tolist()
            width = base.config.num_attention_heads * base.config.head_dim
            figures = roofline.served(base, lengths, base.config.num_hidden_layers, width, rates, this_cpu())
        finally:
            worker.stop()
            inprocess.close()
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {**describe("cpu"), "load_average_at_start": round(load_at_start, 2)},
        "model": {"layout": "Qwen3-Embedding (last token, left padding)", **SHAPE, "max_length": MAX_LENGTH, "vocab": 1000},
        "workload": workload.description,
        "in_process_batch_size": batch,
        "rounds": rounds,
        "bulk_items_per_s": {path: summary([r[path] for r in rounds]) for path in ("in_process", "worker")},
        "single_p50_ms": {"in_process": percentile(local, 0.5), "worker": percentile(remote, 0.5)},
        "roofline": figures,
        "seconds": round(time.monotonic() - started, 1),
    }
    result["worker_over_in_process"] = result["bulk_items_per_s"]["worker"]["median"] / result["bulk_items_per_s"]["in_process"]["median"]
    kind = slug(result["machine"]["kind"])
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{kind}-{os.cpu_count()}cores-decoder-embedder.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    replace_docs_section(ROOT / "docs" / "benchmarks.md", "Decoder-LLM embedder", section(result, out, args.note))
    print(section(result, out, args.note))
    print(f"wrote {out.relative_to(ROOT)} and docs/benchmarks.md in {result['seconds']:.0f} s")


def section(result: dict, results_file: Path, note: str) -> str:
    """The "Decoder-LLM embedder" section of docs/benchmarks.md for one run."""
    m, bulk_figures = result["machine"], result["bulk_items_per_s"]

    def cell(path: str) -> str:
        figures = bulk_figures[path]
        return f"{figures['median']:.0f} ({figures['min']:.0f}-{figures['max']:.0f})"

    return "\n".join(
        [
            "## Decoder-LLM embedder",
            "",
            f"Produced by `python bench/decoder_embedder.py` (raw figures: `{results_file.relative_to(ROOT)}`), {result['date']}: "
            f"a random replica of Qwen3-Embedding's layout ({SHAPE['num_hidden_layers']} layers, {SHAPE['hidden_size']} wide, "
            "last-token pooling, left padding, a 1,000-entry byte-level BPE trained on the spot, texts cut at "
            f"{MAX_LENGTH} tokens; `tools/tiny_decoders.py`), served by one standalone worker, against "
            "`SentenceTransformer.encode` on the same directory in the benchmark process, on the same machine in the same "
            f"run. Same texts: {result['workload']}, as documents, from 4 clients for the worker; the in-process path at its "
            f"best batch size (16, 32, 64, 128 tried; {result['in_process_batch_size']} won). The two take turns pass by pass, "
            f"medians of {len(result['rounds'])} rounds (min-max); single-item p50 over {SINGLE_REQUESTS} one-item requests, "
            "the two paths alternating.",
            "",
            "| date | machine | in-process sentence-transformers, items/s | sie-worker standalone (gRPC), items/s | worker / in-process | single-item p50 in-process (ms) | single-item p50 worker (ms) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
            f"| {result['date']} | {m['kind']} ({', '.join(m['isa'])}), {m['cores']} cores (torch {m['torch_threads']} threads) | "
            f"{cell('in_process')} | {cell('worker')} | {result['worker_over_in_process']:.2f}x | "
            f"{result['single_p50_ms']['in_process']:.1f} | {result['single_p50_ms']['worker']:.1f} |",
            "",
            *roofline.served_lines(result["roofline"], {"in_process": "in-process", "worker": "the worker"}, "texts"),
            "",
            f"Load average {m['load_average_at_start']} at the start; the run took {result['seconds']:.0f} s."
            + (f" {note}" if note else ""),
            "",
        ]
    )


if __name__ == "__main__":
    main()
