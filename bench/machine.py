"""The machine a benchmark ran on: CPU model, cores, the ISA flags that decide matmul speed, and its *kind*.

The kind ("AMD EPYC family 25 model 17 (avx512f, avx512_bf16, avx512_vnni; no AMX)") keys the result files and
the sections of docs/benchmarks.md: figures from different kinds of machine are never compared with, or written
over, one another. It names the CPU family and model, not only the product line: two AMD EPYCs of families 25 and
26, both "no AMX", differed about 2x in fp32 matmul rate, so one section mixed two machines.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

# The flags that decide which matmul kernels a CPU can run (fp32, bf16, int8).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
# Product lines named in the kind; the vendor's name alone where none matches.
_LINES = ("EPYC", "Ryzen", "Threadripper", "Xeon", "Core")
_VENDORS = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}


# The flags a kind names (avx2 is on every machine the benchmark runs on; amx_tile is said as "AMX").
_KIND_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Cpu:
    model: str
    vendor: str
    flags: frozenset[str]
    # /proc/cpuinfo's "cpu family" and "model" (the microarchitecture), "" where it does not say.
    family: str = ""
    model_number: str = ""

    @property
    def kind(self) -> str:
        """e.g. "AMD EPYC family 25 model 17 (avx512f, avx512_bf16, avx512_vnni; no AMX)": vendor, product line, CPU
        family and model, the ISA flags that decide matmul kernels, and whether AMX is there."""
        line = next((name for name in _LINES if re.search(rf"\b{name}\b", self.model, re.I)), "")
        name = " ".join(filter(None, (self.vendor, line)))
        if self.family:
            name += f" family {self.family} model {self.model_number or '?'}"
        flags = [flag for flag in _KIND_FLAGS if flag in self.flags]
        return f"{name} ({', '.join(flags) or 'no AVX-512'}; {'AMX' if self.amx else 'no AMX'})"

    @property
    def amx(self) -> bool:
        return "amx_tile" in self.flags

    @property
    def bf16(self) -> bool:
        """Native bf16 matmuls: AVX512-BF16 or AMX-BF16."""
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    @property
    def vnni(self) -> bool:
        """int8 dot products: AVX512-VNNI, AVX-VNNI or AMX-INT8."""
        return bool(self.flags & {"avx512_vnni", "avx_vnni", "amx_int8"})

    @property
    def isa(self) -> list[str]:
        return [flag for flag in ISA_FLAGS if flag in self.flags]


def slug(kind: str) -> str:
    """A kind as a file-name and section-marker piece: "AMD EPYC family 25 model 17 (avx512f; no AMX)" ->
    "amd-epyc-family-25-model-17-avx512f-no-amx"."""
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def parse_cpuinfo(text: str) -> Cpu:
    """The first processor's model name, vendor, family, model and flags from /proc/cpuinfo's text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    vendor_id = fields.get("vendor_id", "")
    model = fields.get("model name", "") or platform.processor() or platform.machine()
    vendor = _VENDORS.get(vendor_id) or next(
        (name for name in _VENDORS.values() if name.lower() in model.lower()), vendor_id
    )
    return Cpu(
        model=model,
        vendor=vendor,
        flags=frozenset(fields.get("flags", "").split()),
        family=fields.get("cpu family", ""),
        model_number=fields.get("model", ""),
    )


def this_cpu() -> Cpu:
    text = ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
    return parse_cpuinfo(text)


def describe(device: str) -> dict[str, Any]:
    """What goes in every results file's "machine": the CPU, its ISA and kind, threads, and the libraries' versions."""

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    cpu = this_cpu()
    described: dict[str, Any] = {
        "cpu": cpu.model,
        "vendor": cpu.vendor,
        "family": cpu.family,
        "model": cpu.model_number,
        "kind": cpu.kind,
        "isa": cpu.isa,
        "cores": os.cpu_count(),
        "physical_cores": _physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": installed("transformers"),
        "sentence_transformers": installed("sentence-transformers"),
        "onnxruntime": installed("onnxruntime"),
        "grpcio": installed("grpcio"),
    }
    if device.startswith("cuda"):
        described["gpu"] = torch.cuda.get_device_name(0)
    return described


def _physical_cores() -> int | None:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo; None where it does not say."""
    cores: set[tuple[str, str]] = set()
    with contextlib.suppress(OSError):
        for block in Path("/proc/cpuinfo").read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
            fields = {key.strip(): value.strip() for key, value in fields.items()}
            if "core id" in fields:
                cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None
