"""The import layers hold: read statically (ast) from every module file, counting imports under
`if TYPE_CHECKING:` and imports inside functions as well.

- The worker's layers, top to bottom: the process (cli, server, __main__) -> api, cluster -> engine ->
  batching, models -> weights, adapters -> kernels. settings and metrics are leaves: any layer may import them and
  they import nothing of sie_worker. No module imports a layer above its own or a sibling of its own rank
  (batching and models do not import each other; nothing in engine imports api).
- Inside the adapters layer, the contract, the shared set-up and the helpers (layers/) sit under the families:
  nothing but a family (and the package's ADAPTERS) imports a family.
- Proto conversion lives in the worker's api/: below it, nothing imports the sie.v1 messages, protobuf or
  sie_contract.
- No import cycle among the first-party modules.
- sie_client imports nothing of the services or sie_common, nor the worker's heavy dependencies (torch...).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "sie_worker": ROOT / "services/worker/sie_worker",
    "sie_gateway": ROOT / "services/gateway/sie_gateway",
    "sie_config": ROOT / "services/config/sie_config",
    "sie_stack": ROOT / "deploy/local/sie_stack",
    "sie_common": ROOT / "lib/sie_common",
    "sie_client": ROOT / "clients/python/sie_client",
    "sie_contract": ROOT / "contract/python/sie_contract",
}

# The worker's layers by rank: a module may import only ranks below its own.
WORKER_RANKS = {
    "top": 5,
    "api": 4, "cluster": 4,
    "engine": 3,
    "batching": 2, "models": 2,
    "weights": 1, "adapters": 1,
    "kernels": 0,
}  # fmt: skip
# The process: its entry points, the top layer.
TOP = {"__main__", "cli", "server"}
# Leaves: any layer imports them; they import nothing of sie_worker.
WORKER_LEAVES = {"settings", "metrics"}
# Layers that work on the worker's own types: messages are converted in api/ (sie_worker.api.convert).
PROTO_FREE = {"engine", "batching", "models", "weights", "adapters", "kernels"}
PROTO_MODULES = ("sie", "sie_contract", "google.protobuf")
# The adapters layer, and its families (one module each) above the contract and helpers.
ADAPTERS = "sie_worker.adapters"
FAMILIES = "sie_worker.adapters.families"
# What the client distribution may import of first-party code.
CLIENT_MAY_IMPORT = ("sie_client", "sie_contract", "sie")
# The worker's heavy dependencies, which the client's environment does not have.
CLIENT_MUST_NOT_IMPORT = ("torch", "transformers", "peft", "boto3")

Graph = dict[str, set[str]]


def module_names(package: str, folder: Path) -> dict[str, Path]:
    """Every module of `package` (rooted at `folder`) by dotted name; a package by its own name."""
    names = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join((package, *parts))] = path
    return names


def imported_names(module: str, path: Path) -> set[str]:
    """Dotted names `module` imports anywhere in its file; `from a import b` gives a.b (a module, or a name that
    module `a` defines)."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def module_graph(modules: Mapping[str, Path]) -> Graph:
    """Each module's edges to the modules of `modules` it imports (a name that is not a module, such as
    a class imported from one, counts as the module that defines it)."""
    graph: Graph = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def worker_layer(module: str) -> str:
    """The layer of a sie_worker module: its folder, or its own name at the package root."""
    parts = module.split(".")
    return "top" if len(parts) == 1 or parts[1] in TOP else parts[1]


def layer_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Imports of sie_worker modules that break its layers."""
    found = []
    for module, targets in sorted(graph.items()):
        if not module.startswith("sie_worker"):
            continue
        layer = worker_layer(module)
        for target in sorted(targets):
            if not target.startswith("sie_worker"):
                continue
            other = worker_layer(target)
            if other == layer:
                continue
            if layer in WORKER_LEAVES:
                found.append(f"{module} imports {target}: {layer} is a leaf and imports nothing of sie_worker")
            elif other not in WORKER_LEAVES and WORKER_RANKS[other] >= WORKER_RANKS[layer]:
                found.append(f"{module} ({layer}) imports {target} ({other}): not a layer below its own")
    return found


def family_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Imports of an adapter family by a module of the adapters layer that is not a family."""
    return [
        f"{module} imports {target}: only a family (and the package's ADAPTERS) imports a family"
        for module, targets in sorted(graph.items())
        if module.startswith(ADAPTERS + ".") and not module.startswith(FAMILIES)
        for target in sorted(targets)
        if target.startswith(FAMILIES)
    ]


def proto_violations(modules: Mapping[str, Path]) -> list[str]:
    """Imports of messages (or their conversions) by worker modules below api/."""
    return [
        f"{module} imports {name}"
        for module, path in sorted(modules.items())
        if module.startswith("sie_worker.") and worker_layer(module) in PROTO_FREE
        for name in sorted(imported_names(module, path))
        if any(name == proto or name.startswith(proto + ".") for proto in PROTO_MODULES)
    ]


def client_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if module.startswith("sie_client")
        for target in sorted(targets)
        if target.split(".")[0] not in CLIENT_MAY_IMPORT
    ]


def first_party_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGES.items():
        modules |= module_names(package, folder)
    return modules


def first_party_graph() -> Graph:
    return module_graph(first_party_modules())


def test_every_worker_module_has_a_layer() -> None:
    layers = {worker_layer(module) for module in module_names("sie_worker", PACKAGES["sie_worker"])}
    assert not layers - WORKER_RANKS.keys() - WORKER_LEAVES, "add the new folder to WORKER_RANKS"


def test_the_worker_imports_only_downward() -> None:
    violations = layer_violations(first_party_graph())
    assert not violations, "\n".join(violations)


def test_nothing_under_the_families_imports_one() -> None:
    violations = family_violations(first_party_graph())
    assert not violations, "\n".join(violations)


def test_protos_are_converted_in_api() -> None:
    violations = proto_violations(first_party_modules())
    assert not violations, "\n".join(violations)


def test_no_import_cycle() -> None:
    found = cycles(first_party_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(component) for component in found)


def test_the_client_imports_no_service() -> None:
    violations = client_violations(first_party_graph())
    assert not violations, "\n".join(violations)


def test_the_client_imports_none_of_the_workers_dependencies() -> None:
    imported = {
        f"{module} imports {name}"
        for module, path in module_names("sie_client", PACKAGES["sie_client"]).items()
        for name in imported_names(module, path)
        if name.split(".")[0] in CLIENT_MUST_NOT_IMPORT
    }
    assert not imported, "\n".join(sorted(imported))


def test_the_checks_catch_planted_violations(tmp_path: Path) -> None:
    """The rules fail on a synthetic package that breaks each of them."""
    files = {
        "sie_worker/__init__.py": "",
        "sie_worker/engine/__init__.py": "",
        "sie_worker/engine/pipeline.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..api import convert\n"
        ),
        "sie_worker/api/__init__.py": "",
        "sie_worker/api/convert.py": "def f():\n    import sie_worker.engine.pipeline\n",
        "sie_worker/models/registry.py": "from sie_worker.batching.former import BatchFormer\n",
        "sie_worker/batching/former.py": "def f():\n    from sie.v1 import inference_pb2\n",
        "sie_worker/metrics.py": "from sie_worker.engine import pipeline\n",
        "sie_client/client.py": "from sie_common.edge.errors import InvalidArgument\nimport sie_contract.tensors\n",
        "sie_worker/adapters/__init__.py": "",
        "sie_worker/adapters/families/__init__.py": "",
        "sie_worker/adapters/families/gliner.py": "from sie_worker.adapters.contract import Adapter\n",
        "sie_worker/adapters/families/glirel.py": "from sie_worker.adapters.families.gliner import Gliner\n",
        "sie_worker/adapters/layers/padding.py": "from sie_worker.adapters.families import gliner\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = module_names("sie_worker", tmp_path / "sie_worker") | module_names("sie_client", tmp_path / "sie_client")
    modules |= {"sie_common.edge.errors": tmp_path / "sie_worker/__init__.py"}
    modules |= {"sie_contract.tensors": tmp_path / "sie_worker/__init__.py"}
    graph = module_graph(modules)

    assert graph["sie_worker.engine.pipeline"] == {"sie_worker.api.convert"}
    assert cycles(graph) == [["sie_worker.api.convert", "sie_worker.engine.pipeline"]]
    assert layer_violations(graph) == [
        "sie_worker.engine.pipeline (engine) imports sie_worker.api.convert (api): not a layer below its own",
        "sie_worker.metrics imports sie_worker.engine.pipeline: metrics is a leaf and imports nothing of sie_worker",
        "sie_worker.models.registry (models) imports sie_worker.batching.former (batching): not a layer below its own",
    ]
    assert client_violations(graph) == ["sie_client.client imports sie_common.edge.errors"]
    assert proto_violations(modules) == ["sie_worker.batching.former imports sie.v1.inference_pb2"]
    assert family_violations(graph) == [
        "sie_worker.adapters.layers.padding imports sie_worker.adapters.families.gliner: only a family (and the "
        "package's ADAPTERS) imports a family"
    ]
