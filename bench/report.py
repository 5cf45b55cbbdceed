"""The targets of issue 10 checked against one run's figures, each path's share of the machine's matmul rate, and the
tables in docs/benchmarks.md: one generated section per machine kind, merged row by row with the section's earlier runs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from machine import slug

_BEGIN = "<!-- begin generated: {section} -->"
_END = "<!-- end generated: {section} -->"


def _median(result: dict[str, Any], path: str, metric: str) -> float | None:
    figures = result["paths"].get(path, {}).get(metric)
    return None if figures is None else figures["median"]


def _ratio(result: dict[str, Any], path: str, over: str, metric: str = "bulk") -> float | None:
    top, bottom = _median(result, path, metric), _median(result, over, metric)
    return None if top is None or not bottom else top / bottom


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: what it asks, what this run measured, whether it holds and by how much it is missed."""
    checks: list[dict[str, Any]] = []

    def check(
        name: str, measured: float | None, limit: float, higher_is_better: bool, unit: str, show: Callable[[float], str], applies: str | None = None
    ) -> None:
        if measured is None:
            checks.append({"target": name, "measured": None, "met": None, "missed_by": "not measured in this run"})
            return
        if applies is not None:  # measured, but the target is for another kind of machine
            checks.append({"target": name, "measured": round(measured, 6), "shown": show(measured), "met": None, "missed_by": applies})
            return
        met = measured >= limit if higher_is_better else measured < limit
        gap = (limit - measured) if higher_is_better else (measured - limit)
        checks.append({"target": name, "measured": round(measured, 6), "shown": show(measured), "met": met, "missed_by": None if met else f"{show(gap)}{unit}"})

    ratio = lambda value: f"{value:.2f}"  # noqa: E731
    millis = lambda value: f"{value:.2f}"  # noqa: E731
    on_gpu = result["settings"]["device"].startswith("cuda")
    check("standalone worker >= 0.90x the in-process ceiling (bulk, ratio)", _ratio(result, "worker", "in-process"), 0.90, True, "x", ratio)
    if on_gpu:
        return checks
    check("SDK -> gateway -> worker >= 0.85x the ceiling (bulk, ratio)", _ratio(result, "gateway", "in-process"), 0.85, True, "x", ratio)
    check("standalone worker >= 1.3x sie-server at its best thread count (bulk, ratio)", _ratio(result, "worker", "sie-server"), 1.3, True, "x", ratio)
    worker_p50, peer_p50 = _median(result, "worker", "single_p50_ms"), _median(result, "sie-server", "single_p50_ms")
    check(
        "standalone worker single-item p50 below sie-server's (difference, ms)",
        None if worker_p50 is None or peer_p50 is None else worker_p50 - peer_p50, 0.0, False, " ms", millis,
    )
    gateway_p50, inproc_p50 = _median(result, "gateway", "single_p50_ms"), _median(result, "in-process", "single_p50_ms")
    check(
        "single-item p50 through the gateway within 5 ms of in-process (difference, ms)",
        None if gateway_p50 is None or inproc_p50 is None else gateway_p50 - inproc_p50, 5.0, False, " ms", millis,
    )
    hop = result.get("gateway_hop")
    check("the gateway hop adds < 1 ms p50 (tiny model, ms)", None if hop is None else hop["added_p50_ms"], 1.0, False, " ms", millis)
    fraction = result["paths"].get("worker", {}).get("fp32_roofline_fraction", {}).get("bulk")
    check("standalone worker >= 0.80 of the fp32 roofline (bulk, fraction)", fraction, 0.80, True, "", ratio)
    amx = "amx_tile" in result["machine"].get("isa", [])
    check(
        "bf16 worker >= 3x the fp32 worker on an AMX machine (bulk, ratio)", _ratio(result, "worker-bf16", "worker"), 3.0, True, "x", ratio,
        applies=None if amx else "the target is for AMX machines; this one has none",
    )
    quality = result["paths"].get("worker-bf16", {}).get("quality")
    check("bf16 worker: cosine to fp32 >= 0.999 on every bulk text (min)", None if quality is None else quality["min_cosine"], 0.999, True, "", lambda v: f"{v:.5f}")
    check(
        "bf16 worker: the same top-10 neighbours as fp32 (queries that keep them, of the retrieval set's)",
        None if quality is None else quality["same_top_k_set"], quality["queries"] if quality else 0, True, " queries", lambda v: f"{v:.0f}",
    )
    check("standalone worker ahead of ONNX Runtime, fp32 (bulk, ratio)", _ratio(result, "worker", "onnxruntime"), 1.0, True, "x", ratio)
    check("int8 worker ahead of ONNX Runtime, int8 (bulk, ratio)", _ratio(result, "worker-int8", "onnxruntime-int8"), 1.0, True, "x", ratio)
    return checks


def add_efficiency(result: dict[str, Any]) -> None:
    """Each measured path's effective GFLOP/s per workload (items/s * the workload's FLOPs per text), its fraction
    of the fp32 roofline and of its own precision's (a path's `precision`: a roofline kernel, fp32 unless set), into
    the path's figures."""
    fp32 = result.get("roofline", {}).get("gflops", {}).get("fp32")
    for path in result["paths"].values():
        for workload, figures in result.get("flops", {}).items():
            if workload not in path:
                continue
            gflops = path[workload]["median"] * figures["flops"] / figures["texts"] / 1e9
            path.setdefault("effective_gflops", {})[workload] = gflops
            if isinstance(fp32, float):
                path.setdefault("fp32_roofline_fraction", {})[workload] = gflops / fp32
            own = result.get("roofline", {}).get("gflops", {}).get(path.get("precision", "fp32"))
            if isinstance(own, float):
                path.setdefault("own_roofline_fraction", {})[workload] = gflops / own


def _rate(value: float | str | None) -> str:
    return f"{value:,.0f}" if isinstance(value, float) else (value or "not measured")


def _roofline_lines(result: dict[str, Any]) -> list[str]:
    """The machine's ISA, the matmul rates of the model's shapes and the workloads' FLOPs, where the run recorded them."""
    m, lines = result["machine"], []
    if "isa" in m:
        lines += ["", f"Machine kind **{m['kind']}**; ISA flags: {', '.join(m['isa']) or 'none of those looked for'}."]
    roof = result.get("roofline")
    if roof:
        rates = roof["gflops"]
        lines += [
            "",
            f"Roofline (`bench/roofline.py`): the model's Linear shapes at {roof['rows']} rows (64 texts of the bulk mean), "
            f"{roof['torch_threads']} torch threads, best of {roof['repeats']}"
            f"{' before and after the paths' if roof.get('measurements') == 2 else ''}: **fp32 {_rate(rates.get('fp32'))} GFLOP/s**"
            + (f" (per shape the faster of PyTorch's Linear, {_rate(rates['fp32-mkl'])}, and oneDNN's packed matmul, {_rate(rates['fp32-onednn'])})" if "fp32-mkl" in rates else "")
            + ", "
            f"bf16 {_rate(rates.get('bf16'))}, int8 {_rate(rates.get('int8'))} (torch._int_mm), "
            f"int8 dynamic-quantized Linear {_rate(rates.get('int8-dynamic'))}.",
        ]
    workloads = [
        f"{name}: {flops['tokens']:,} real tokens in {flops['texts']:,} texts (mean {flops['mean_tokens']:.1f}, attention "
        f"span {flops['attention_span']:.1f}), {flops['flops_per_token'] / 1e6:.2f} MFLOP a token, {flops['flops'] / 1e12:.3f} TFLOP"
        for name, flops in result.get("flops", {}).items()
    ]
    return lines + (["", "FLOPs (the formula is above): " + "; ".join(workloads) + "."] if workloads else [])


def _share(path: dict[str, Any], key: str, digits: int) -> str:
    value = path.get(key, {}).get("bulk")
    return "-" if value is None else f"{value:.{digits}f}"


def _cell(figures: dict[str, float] | None, digits: int) -> str:
    if figures is None:
        return "-"
    return f"{figures['median']:.{digits}f} ({figures['min']:.{digits}f}-{figures['max']:.{digits}f})"


def table(result: dict[str, Any]) -> str:
    """Markdown: machine, one row per path, the gateway hop and the targets."""
    m, s = result["machine"], result["settings"]
    device = m.get("gpu", f"{m['cores']} cores, {m['cpu']}")
    lines = [
        f"Machine: {device}; Python {m['python']}, torch {m['torch']} ({s['torch_threads']} threads), transformers "
        f"{m['transformers']}, sentence-transformers {m['sentence_transformers']}, "
        + (f"onnxruntime {m['onnxruntime']}, " if "onnxruntime" in m else "")
        + f"grpcio {m['grpcio']}; {result['date']}. "
        f"Device {s['device']}, attention {s['attention']}, batch wait {s['SIE_MAX_BATCH_WAIT_MS']}. "
        f"Medians of {s['runs']} runs (min-max) after a warm-up pass; {s['clients']} concurrent clients; the whole run took {result.get('duration_s', '?')} s."
        + (f" **{s['note']}**" if s.get("note") else ""),
        *_roofline_lines(result),
        "",
        f"Model {result['model']}. Workloads: " + "; ".join(f"**{name}**: {text}" for name, text in result["workloads"].items()) + ".",
        "",
        "| path | bulk items/s | bulk effective GFLOP/s | fraction of fp32 roofline (bulk) | fraction of its precision's roofline (bulk) | long-text items/s | single-item p50 ms | single-item p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    failed = []
    for key, path in result["paths"].items():
        if "error" in path:
            failed.append(f"- **{key}** did not run: `{path['error'].strip().splitlines()[-1][:300]}` (the whole message is in the results file)")
            continue
        label = path["label"]
        if "batch_sizes" in path:
            label += " (batch " + ", ".join(f"{size} {name}" for name, size in path["batch_sizes"].items()) + ")"
        if "from" in path:
            label += f" (not in this run: {path['date']}, `{path['from']}`)"
        lines.append(
            f"| {label} | {_cell(path.get('bulk'), 0)} | {_share(path, 'effective_gflops', 0)} | {_share(path, 'fp32_roofline_fraction', 2)} | "
            f"{_share(path, 'own_roofline_fraction', 2)} | "
            f"{_cell(path.get('long'), 1)} | {_cell(path.get('single_p50_ms'), 2)} | {_cell(path.get('single_p99_ms'), 2)} |"
        )
    lines += ["", *failed] if failed else []
    lines += _quality_lines(result)
    if "sie-server" in result["paths"] and "torch_threads_tried" in result["paths"]["sie-server"]:
        tried = result["paths"]["sie-server"]["torch_threads_tried"]
        lines += ["", "sie-server thread counts tried (one bulk pass each, items/s): " + ", ".join(f"SIE_TORCH_NUM_THREADS={k}: {v:.0f}" for k, v in tried.items()) + "."]
    hop = result.get("gateway_hop")
    if hop:
        lines += [
            "",
            f"Gateway hop on {hop['model']} (2 layers, 32 wide), single-item p50: worker directly {_cell(hop['worker_p50_ms'], 2)} ms, "
            f"through the gateway {_cell(hop['gateway_p50_ms'], 2)} ms: the hop adds {hop['added_p50_ms']:.2f} ms"
            + (f" (not in this run: `{hop['from']}`)." if "from" in hop else "."),
        ]
        if "bare_proxy_p50_ms" in hop:
            lines[-1] += (
                f" In the same turns, a bare grpc.aio proxy on one Work stream in front of the same worker (`bench/grpc_hop_floor.py`): "
                f"{_cell(hop['bare_proxy_p50_ms'], 2)} ms, adding {hop['bare_proxy_added_p50_ms']:.2f} ms."
            )
    lines += ["", "| target | measured | met | missed by |", "| --- | ---: | :---: | --- |"]
    for target in result["targets"]:
        met = {True: "yes", False: "**no**", None: "-"}[target["met"]]
        measured = "-" if target["measured"] is None else target.get("shown", f"{target['measured']:.2f}")
        lines.append(f"| {target['target']} | {measured} | {met} | {target['missed_by'] or ''} |")
    return "\n".join(lines) + "\n"


def _quality_lines(result: dict[str, Any]) -> list[str]:
    """The reduced-precision paths against the float32 worker on the bulk texts (bench/precision.py)."""
    rows = [(key, path) for key, path in result["paths"].items() if "quality" in path and "error" not in path]
    if not rows:
        return []
    lines = [
        "",
        "Reduced precision against the float32 worker (`bench/precision.py`): cosines on every bulk text; neighbours: "
        f"{rows[0][1]['quality']['queries']} queries against {rows[0][1]['quality']['corpus']} paragraphs of Python's own "
        "documentation (`pydoc_data.topics`), top 10 by cosine; a query whose top 10 changed only by documents float32 "
        "scores within 0.001 of its 10th counts as changed by near-ties only.",
        "",
        "| path | speed-up over the fp32 worker (bulk) | runs in | min cosine | mean cosine | same top-10 set | same top-10 order | changed by near-ties only |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, path in rows:
        q = path["quality"]
        speedup = _ratio(result, key, "worker")
        lines.append(
            f"| {path['label']} | {'-' if speedup is None else f'{speedup:.2f}x'} | {path.get('runs_in', '-')} | {q['min_cosine']:.5f} | "
            f"{q['mean_cosine']:.5f} | {q['same_top_k_set']} of {q['queries']} | {q['same_top_k_order']} of {q['queries']} | "
            f"{q.get('changed_by_near_ties_only', '-')} |"
        )
    return lines


def section_name(result: dict[str, Any]) -> str:
    """The generated section a run belongs to: "gpu", or "cpu-" and the machine kind's slug."""
    if result["settings"]["device"].startswith("cuda"):
        return "gpu"
    return f"cpu-{slug(result['machine']['kind'])}" if "kind" in result["machine"] else "cpu"


_ROWS = re.compile(r"<!-- rows from: (\{.*?\}) -->")


def _earlier_rows(section: str, root: Path) -> dict[str, str]:
    """Path key -> the results file its row in `section` came from (a section written before this record: every row
    of its one raw-figures file)."""
    if found := _ROWS.search(section):
        return dict(json.loads(found.group(1)))
    if found := re.search(r"Raw figures: `([^`]+)`", section):
        earlier = json.loads((root / found.group(1)).read_text())
        return dict.fromkeys(earlier["paths"], found.group(1))
    return {}


def merged(result: dict[str, Any], results_file: Path, section: str, root: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """`result` with the rows `section` showed for paths this run did not measure (each marked with its file and date;
    the gateway hop comes with the gateway's row), and which file each row now comes from."""
    sources = {key: str(results_file) for key in result["paths"]}
    paths = dict(result["paths"])
    hop = result.get("gateway_hop")
    for key, source in _earlier_rows(section, root).items():
        if key in paths or not (root / source).exists():
            continue
        earlier = json.loads((root / source).read_text())
        if key in earlier["paths"]:
            paths[key] = {**earlier["paths"][key], "from": source, "date": earlier["date"]}
            sources[key] = source
            if key == "gateway" and not result.get("gateway_hop") and earlier.get("gateway_hop"):
                hop = {**earlier["gateway_hop"], "from": source}
    return {**result, "paths": paths, "gateway_hop": hop}, sources


def write_docs(result: dict[str, Any], results_file: Path, docs: Path, root: Path | None = None) -> None:
    """Replace this machine kind's (or the GPU's) generated section of docs/benchmarks.md, keeping the rows of paths
    this run did not measure; other kinds' sections and the hand-written text around them stay as they are.
    `results_file` is relative to `root` (default: the repository holding `docs`)."""
    root = root or docs.resolve().parents[1]
    name = section_name(result)
    begin, end = _BEGIN.format(section=name), _END.format(section=name)
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    old = text.split(begin, 1)[1].split(end, 1)[0] if begin in text and end in text else ""
    shown, sources = merged(result, results_file, old, root)
    body = f"{begin}\n<!-- rows from: {json.dumps(sources)} -->\nRaw figures: `{results_file}`.\n\n{table(shown)}{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + body + rest.split(end, 1)[1]
    elif name.startswith("cpu-"):
        text = _insert_in_cpu(text, f"### {result['machine']['kind']}\n\n{body}\n")
    else:
        text = text.rstrip("\n") + f"\n\n## {'GPU' if name == 'gpu' else 'CPU'}\n\n{body}\n"
    docs.write_text(text)


def _insert_in_cpu(text: str, subsection: str) -> str:
    """`subsection` at the end of the `## CPU` section (made at the end of `text` where there is none)."""
    heading = re.search(r"^## CPU\n", text, re.M)
    if heading is None:
        return text.rstrip("\n") + f"\n\n## CPU\n\n{subsection}"
    following = re.search(r"^## ", text[heading.end() :], re.M)
    at = heading.end() + following.start() if following else len(text)
    return text[:at].rstrip("\n") + f"\n\n{subsection}\n" + text[at:]


def replace_docs_section(docs: Path, heading: str, section: str) -> None:
    """Put `section` in place of the `## heading` section of `docs` (up to the next `## `), or append it."""
    text = docs.read_text()
    pattern = re.compile(rf"## {re.escape(heading)}\n.*?(?=\n## |\Z)", re.S)
    text = pattern.sub(lambda _: section.rstrip("\n") + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    docs.write_text(text.rstrip("\n") + "\n")
