"""The targets of issue 10 checked against one run's figures, and the table in docs/benchmarks.md."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

    def check(name: str, measured: float | None, limit: float, higher_is_better: bool, unit: str, show: Callable[[float], str]) -> None:
        if measured is None:
            checks.append({"target": name, "measured": None, "met": None, "missed_by": "not measured in this run"})
            return
        met = measured >= limit if higher_is_better else measured < limit
        gap = (limit - measured) if higher_is_better else (measured - limit)
        checks.append({"target": name, "measured": round(measured, 4), "met": met, "missed_by": None if met else f"{show(gap)}{unit}"})

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
    return checks


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
        f"{m['transformers']}, sentence-transformers {m['sentence_transformers']}, grpcio {m['grpcio']}; {result['date']}. "
        f"Device {s['device']}, attention {s['attention']}, batch wait {s['SIE_MAX_BATCH_WAIT_MS']}. "
        f"Medians of {s['runs']} runs (min-max) after a warm-up pass; {s['clients']} concurrent clients; the whole run took {result.get('duration_s', '?')} s.",
        "",
        f"Model {result['model']}. Workloads: " + "; ".join(f"**{name}**: {text}" for name, text in result["workloads"].items()) + ".",
        "",
        "| path | bulk items/s | long-text items/s | single-item p50 ms | single-item p99 ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    failed = []
    for key, path in result["paths"].items():
        if "error" in path:
            failed.append(f"- **{key}** did not run: `{path['error'].strip().splitlines()[-1][:300]}` (the whole message is in the results file)")
            continue
        label = path["label"]
        if "batch_sizes" in path:
            label += " (batch " + ", ".join(f"{size} {name}" for name, size in path["batch_sizes"].items()) + ")"
        lines.append(
            f"| {label} | {_cell(path.get('bulk'), 0)} | {_cell(path.get('long'), 1)} | "
            f"{_cell(path.get('single_p50_ms'), 2)} | {_cell(path.get('single_p99_ms'), 2)} |"
        )
    lines += ["", *failed] if failed else []
    if "sie-server" in result["paths"] and "torch_threads_tried" in result["paths"]["sie-server"]:
        tried = result["paths"]["sie-server"]["torch_threads_tried"]
        lines += ["", "sie-server thread counts tried (one bulk pass each, items/s): " + ", ".join(f"SIE_TORCH_NUM_THREADS={k}: {v:.0f}" for k, v in tried.items()) + "."]
    hop = result.get("gateway_hop")
    if hop:
        lines += [
            "",
            f"Gateway hop on {hop['model']} (2 layers, 32 wide), single-item p50: worker directly {_cell(hop['worker_p50_ms'], 2)} ms, "
            f"through the gateway {_cell(hop['gateway_p50_ms'], 2)} ms: the hop adds {hop['added_p50_ms']:.2f} ms.",
        ]
        if "bare_proxy_p50_ms" in hop:
            lines[-1] += (
                f" In the same turns, a bare grpc.aio proxy on one Work stream in front of the same worker (`bench/grpc_hop_floor.py`): "
                f"{_cell(hop['bare_proxy_p50_ms'], 2)} ms, adding {hop['bare_proxy_added_p50_ms']:.2f} ms."
            )
    lines += ["", "| target | measured | met | missed by |", "| --- | ---: | :---: | --- |"]
    for target in result["targets"]:
        met = {True: "yes", False: "**no**", None: "-"}[target["met"]]
        measured = "-" if target["measured"] is None else f"{target['measured']:.2f}"
        lines.append(f"| {target['target']} | {measured} | {met} | {target['missed_by'] or ''} |")
    return "\n".join(lines) + "\n"


def write_docs(result: dict[str, Any], results_file: Path, docs: Path) -> None:
    """Replace this device's generated section of docs/benchmarks.md; the hand-written text around it stays."""
    section = "gpu" if result["settings"]["device"].startswith("cuda") else "cpu"
    begin, end = _BEGIN.format(section=section), _END.format(section=section)
    body = f"{begin}\nRaw figures: `{results_file}`.\n\n{table(result)}{end}"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {'GPU' if section == 'gpu' else 'CPU'}\n\n{body}\n"
    docs.write_text(text)


def replace_docs_section(docs: Path, heading: str, section: str) -> None:
    """Put `section` in place of the `## heading` section of `docs` (up to the next `## `), or append it."""
    text = docs.read_text()
    pattern = re.compile(rf"## {re.escape(heading)}\n.*?(?=\n## |\Z)", re.S)
    text = pattern.sub(lambda _: section.rstrip("\n") + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    docs.write_text(text.rstrip("\n") + "\n")
