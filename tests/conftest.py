"""What the whole suite shares: the tiers (markers applied from the fixtures a test uses), the processes tests start
(the shared tiny worker, etcd, an S3 server, the HTTP edges, clusters), the tiny models and the launch count.

Tiers (registered in pyproject.toml, `--strict-markers`):
- `process`: the test starts processes (a worker, gateway, config service, etcd, Envoy, any subprocess). Applied to
  every test whose fixtures include one of PROCESS_FIXTURES; a test that starts a process some other way carries the
  mark itself. A test without it that starts a subprocess fails (`make test-fast` runs the tests without it).
- `cluster`: the test needs etcd (applied from `etcd_server`), and with it usually a config service and a gateway.
- `reliability`: the test adds rows to the reliability summary (its fixtures include `reliability_report`), or lives
  under tests/reliability/.
- `slow`: marked by hand on the slowest tests; `make test-fast` (-m "not process and not slow") leaves them out.
In-process tests of the worker's engine (an Engine built around a fake adapter and a registry passed in) need no
marker: they are the in-process tier's, as the batch former's, the planner's and the request checks' are.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import sie_stack.processes
from service_zygote import Zygote
from sie.v1 import inference_pb2_grpc
from sie_common.cluster.etcd import Etcd
from sie_stack.processes import ChildProcess, EtcdProcess
from tiny_models import (
    VARIANTS,
    build_tiny_clip,
    build_tiny_colbert,
    build_tiny_head_model,
    build_tiny_lora,
    build_tiny_model,
    build_tiny_siglip,
    write_config,
    write_model_yaml,
)
from worker_process import Services, WorkerProcess, free_port, stop_all

from edge_helpers import AUTH_TOKEN, Edge, running_edge
from launches import LaunchCount
from parallel_files import FILE_SECONDS, GROUPS_FILE, FileGroupScheduling, file_seconds, longest_first, write_groups
from reference_sdk import prepare as prepare_reference_environments
from reliability.report import ReliabilityReport

# The suite compares what workers serve with the reference libraries at float32 tolerances, so every worker and
# engine it starts computes in float32 whatever the CPU (on an AMX machine, `auto` would pick bfloat16).
# tests/test_cpu_precision.py asks for the other precisions explicitly.
os.environ.setdefault("SIE_CPU_COMPUTE_PRECISION", "float32")
# torch's OpenMP threads spin while they wait for work by default: with the suite's many processes on two cores the
# spinning takes the cores from the processes with work to do (a loop of tiny matmuls on a busy machine: 10 s of CPU
# spinning against 1 s passive). Every process the suite starts inherits this; pytest-xdist's processes too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A suite started in the background by a non-interactive shell (`make test &`, some CI runners) inherits SIGINT
# ignored, and so would every `sie up` it starts: `sie up` keeps an ignored stop signal ignored (as under nohup), so
# the tests that press Ctrl-C would find it ignored. They stand for a user at a terminal, where SIGINT is delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Every service the suite starts (sie_stack's launchers included) takes its ports from this process's own block, so
# parallel test processes (pytest-xdist) never pick the same port (tools/worker_process.py).
sie_stack.processes.free_port = free_port

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
LORA_MODEL = "test/tiny-mean-lora"
LORAS = ("alpha", "beta", "gamma")
# Model id -> YAML body after `path:`, for the models of the other operations and output types.
OPERATION_MODELS = {
    "test/tiny-splade": "tasks: [encode]\noutput_types: [sparse]\nprofiles:\n  default:\n    adapter: splade\n",
    "test/tiny-colbert": (
        "tasks: [encode, score]\noutput_types: [multivector, dense]\nprofiles:\n  default:\n    adapter: colbert\n"
        "    load_options: {query_length: 12}\n"
        "    run_options:\n      muvera: {k_sim: 3, d_proj: 8, repetitions: 20, seed: 7}\n"
    ),
    "test/tiny-reranker": "tasks: [score]\nprofiles:\n  default:\n    adapter: cross_encoder\n",
    "test/tiny-ner": "tasks: [extract]\nprofiles:\n  default:\n    adapter: token_classifier\n",
    # A dual encoder; profile `raw` leaves its embeddings unnormalized.
    "test/tiny-clip": (
        "inputs: [text, image]\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: clip\n"
        "  raw:\n    extends: default\n    load_options: {normalize: false}\n"
    ),
    "test/tiny-siglip": "inputs: [text, image]\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: clip\n",
}
# Served but never preloaded: its config asks its adapter for a task it lacks.
MISCONFIGURED_MODEL = "test/splade-as-reranker"
EVERY_TINY_MODEL = ",".join([MINILM, *(f"test/{name}" for name in VARIANTS), *OPERATION_MODELS, LORA_MODEL])

# A test whose fixtures include one of these starts processes (it is marked `process`): module fixtures that start
# their own services use `services`, session-wide ones `session_services`.
PROCESS_FIXTURES = frozenset({"session_services", "services", "start_worker", "start_module_worker", "start_config"})
CLUSTER_FIXTURES = frozenset({"etcd_server"})
# Session fixtures that start several processes: under pytest-xdist the files that use one run in the same worker
# process, so it starts once (tests/parallel_files.py).
SHARED_SERVERS = frozenset({"edge", "auth_edge"})
RELIABILITY_DIR = Path(__file__).parent / "reliability"


# --- tiers -------------------------------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "reliability_report" in fixtures or RELIABILITY_DIR in item.path.parents:
            item.add_marker("reliability")
        if fixtures & CLUSTER_FIXTURES:
            item.add_marker("cluster")
        if fixtures & PROCESS_FIXTURES or item.get_closest_marker("cluster"):
            item.add_marker("process")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        groups = _file_groups(items)
        _longest_files_first(config, items, groups)
        if GROUPS_FILE in workerinput:
            write_groups(Path(workerinput[GROUPS_FILE]), groups)


def _file_groups(items: list[pytest.Item]) -> dict[str, str]:
    """File -> the shared servers its tests use, for the files whose tests use any."""
    servers: dict[str, set[str]] = {}
    for item in items:
        servers.setdefault(item.nodeid.split("::")[0], set()).update(_shared_servers(item))
    return {path: "+".join(sorted(used)) for path, used in servers.items() if used}


def _shared_servers(item: pytest.Item) -> set[str]:
    """The SHARED_SERVERS `item` uses: this file's fixtures, not a module's own fixture of the same name."""
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return set()
    here = Path(__file__).parent.relative_to(item.config.rootpath).as_posix()
    return {
        name
        for name in SHARED_SERVERS & set(definitions.names_closure)
        if definitions.name2fixturedefs[name][-1].baseid == here
    }


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    """Tell each pytest-xdist worker where to write the files' groups."""
    node.workerinput[GROUPS_FILE] = str(_groups_file(node.config))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    if config.getvalue("dist") == "loadfile":
        return FileGroupScheduling(config, log, _groups_file(config))
    return None


_PREPARING: dict[str, threading.Thread | None] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Once the first worker has collected, the controller makes the reference SDK's environments the collected files
    ask for (tests/reference_sdk.py) while the workers run the files: on a clean clone that is a minute or two of pip
    no test process waits through."""
    if "thread" not in _PREPARING:
        _PREPARING["thread"] = prepare_reference_environments({nodeid.split("::")[0] for nodeid in ids})


def _groups_file(config: pytest.Config) -> Path:
    return Path(tempfile.gettempdir()) / f"sie-test-file-groups-{os.getpid()}.json"


def _longest_files_first(config: pytest.Config, items: list[pytest.Item], groups: dict[str, str]) -> None:
    """Under pytest-xdist (files are handed out in collection order, --no-loadscope-reorder): the files that took
    longest in the last run here, else in the recorded run (tests/file_seconds.json), first (tests/parallel_files.py),
    each file's own order kept, so the run does not end with one process alone on a long file. A file timed in
    neither counts by its tier: it has slow tests, starts a cluster, starts other processes, or none."""

    def tier(item: pytest.Item) -> int:
        return next(
            (rank for rank, mark in enumerate(("slow", "cluster", "process")) if item.get_closest_marker(mark)), 3
        )

    tiers: dict[str, int] = {}
    for item in items:
        path = _file_of(item)
        tiers[path] = min(tiers.get(path, 3), tier(item))
    seconds = file_seconds(config.cache.get(FILE_SECONDS, {}) if config.cache is not None else {})
    order = {path: index for index, path in enumerate(longest_first(list(tiers), tiers, groups, seconds))}
    items.sort(key=lambda item: order[_file_of(item)])


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


_FILE_SECONDS: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Time each file (its tests' setup, call and teardown), for the next run's order."""
    _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


class ProcessInAnInProcessTest(AssertionError):
    pass


_RUNNING: dict[str, pytest.Item | None] = {"item": None}
_LAUNCHES = LaunchCount()
_spawn = subprocess.Popen._execute_child  # type: ignore[attr-defined]
# The services the tests start (`python -m sie_worker|sie_gateway|sie_config`) are forks of one process per test
# process that has imported them (tools/service_zygote.py): a worker's imports (torch, transformers) cost 4-8 s of
# CPU, and the suite starts over a hundred. SIE_TEST_FORK_SERVICES=0 spawns each one as a fresh interpreter.
_ZYGOTE = Zygote() if os.environ.get("SIE_TEST_FORK_SERVICES", "1") != "0" else None


def _guarded_spawn(self: subprocess.Popen, args, *rest):  # type: ignore[no-untyped-def]
    """Count each process the tests start; refuse one started by a test not marked `process`; fork the services."""
    item = _RUNNING["item"]
    argv = [os.fspath(arg) for arg in args] if isinstance(args, (list, tuple)) else [os.fspath(args)]
    if item is not None and item.get_closest_marker("process") is None:
        raise ProcessInAnInProcessTest(
            f"{item.nodeid} started {argv[:4]} but is not marked `process`: use a process fixture "
            f"({', '.join(sorted(PROCESS_FIXTURES))}) or mark it @pytest.mark.process"
        )
    forked = _ZYGOTE is not None and _ZYGOTE.execute_child(self, args, *rest)
    if item is not None:
        _LAUNCHES.add(argv, item.nodeid, forked=forked)
    return None if forked else _spawn(self, args, *rest)


subprocess.Popen._execute_child = _guarded_spawn  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    _RUNNING["item"] = item
    try:
        return (yield)
    finally:
        _RUNNING["item"] = None


# --- what the run reports: the reliability summary and the launch count, merged across pytest-xdist workers ------

_REPORT = ReliabilityReport()


@pytest.fixture(scope="session")
def reliability_report() -> ReliabilityReport:
    return _REPORT


def pytest_runtest_setup(item: pytest.Item) -> None:
    _REPORT.source = item.nodeid


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _ZYGOTE is not None:
        _ZYGOTE.stop()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its rows and launches go to the controller
        workeroutput["reliability_rows"] = _REPORT.dumps()
        workeroutput["launches"] = _LAUNCHES.dumps()
        return
    _groups_file(session.config).unlink(missing_ok=True)
    preparing = _PREPARING.get("thread")
    if preparing is not None:  # no pip left running after the run (a short one may end before it is done)
        preparing.join()
    cache = session.config.cache
    if cache is not None and _FILE_SECONDS and session.config.getoption("dist", default="no") != "no":
        # Timed under pytest-xdist only: the order is make test's, and the in-process tier runs part of a file.
        cache.set(FILE_SECONDS, {**cache.get(FILE_SECONDS, {}), **_FILE_SECONDS})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    output = getattr(node, "workeroutput", {})
    _REPORT.merge(output.get("reliability_rows", "[]"))
    _LAUNCHES.merge(output.get("launches", "{}"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    _REPORT.summarize(terminalreporter)
    _LAUNCHES.summarize(terminalreporter)


# --- processes ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def weight_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workers the tests start may read weights from the session's temporary directory (SIE_WEIGHT_ROOTS)."""
    previous = os.environ.get("SIE_WEIGHT_ROOTS")
    os.environ["SIE_WEIGHT_ROOTS"] = str(tmp_path_factory.getbasetemp())
    yield
    if previous is None:
        os.environ.pop("SIE_WEIGHT_ROOTS", None)
    else:
        os.environ["SIE_WEIGHT_ROOTS"] = previous


@pytest.fixture(scope="session")
def session_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Processes that serve the whole session (the tiny worker, etcd, the S3 server, the edges); stopped at its end."""
    started = Services(tmp_path_factory.mktemp("session-logs"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Processes one test module starts (`services.worker(env)`, ...); stopped when the module ends."""
    started = Services(tmp_path_factory.mktemp("module-logs"))
    yield started
    started.stop()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model id -> directory for each tiny variant."""
    root = tmp_path_factory.mktemp("tiny-models")
    built = {}
    for name, (pooling, normalize, include_prompt) in VARIANTS.items():
        built[f"test/{name}"] = build_tiny_model(
            root / name, pooling=pooling, normalize=normalize, include_prompt=include_prompt
        )
    built["test/tiny-splade"] = build_tiny_head_model(root / "splade", "masked_lm")
    built["test/tiny-reranker"] = build_tiny_head_model(root / "reranker", "reranker")
    built["test/tiny-ner"] = build_tiny_head_model(root / "ner", "ner")
    built["test/tiny-colbert"] = build_tiny_colbert(root / "colbert")
    built["test/tiny-clip"] = build_tiny_clip(root / "clip")
    built["test/tiny-siglip"] = build_tiny_siglip(root / "siglip")
    for seed, name in enumerate(LORAS, start=1):
        built[f"lora/{name}"] = build_tiny_lora(root / "loras" / name, built["test/tiny-mean"], seed=seed)
    return built


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    directory = tmp_path_factory.mktemp("model-configs")
    for name in VARIANTS:
        write_model_yaml(directory, f"test/{name}", tiny_models[f"test/{name}"])
    for model_id, body in OPERATION_MODELS.items():
        write_config(directory, model_id, f"path: {tiny_models[model_id]}\n{body}")
    loras = "".join(f"  {name}: {tiny_models[f'lora/{name}']}\n" for name in LORAS)
    write_config(
        directory,
        LORA_MODEL,
        f"path: {tiny_models['test/tiny-mean']}\nloras:\n{loras}profiles:\n  default:\n    adapter: sentence_transformer\n",
    )
    write_config(
        directory,
        MISCONFIGURED_MODEL,
        f"path: {tiny_models['test/tiny-splade']}\ntasks: [score]\nprofiles:\n  default:\n    adapter: splade\n",
    )
    return directory


def _tiny_worker(started: Services, models_dir: Path, env: dict[str, str]) -> WorkerProcess:
    """A worker serving the tiny models, every one preloaded unless `SIE_PRELOAD_MODELS` says otherwise."""
    return started.worker({"SIE_MODELS_DIR": str(models_dir), "SIE_PRELOAD_MODELS": EVERY_TINY_MODEL, **env})


@pytest.fixture
def start_worker(tmp_path: Path, models_dir: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start tiny-model workers with extra env; they stop when the test ends."""
    started = Services(tmp_path / "worker-logs")
    yield lambda **env: _tiny_worker(started, models_dir, env)
    started.stop()


@pytest.fixture(scope="module")
def start_module_worker(services: Services, models_dir: Path) -> Callable[..., WorkerProcess]:
    """Start tiny-model workers with extra env for a module's fixtures; they stop when the module ends."""
    return lambda **env: _tiny_worker(services, models_dir, env)


@pytest.fixture(scope="session")
def worker(session_services: Services, models_dir: Path) -> WorkerProcess:
    """The tiny worker: default settings, every tiny model (and MiniLM) preloaded, shared by the whole session.

    Tests may load models and LoRA adapters on it, never change or stop it."""
    return _tiny_worker(session_services, models_dir, {})


@pytest.fixture
def stub(worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    """An Inference client of the tiny worker (`worker`)."""
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


@pytest.fixture(scope="session")
def batching_stub(session_services: Services, models_dir: Path) -> Iterator[inference_pb2_grpc.InferenceStub]:
    """A worker that keeps at most 2 LoRA adapters and waits 300 ms for batches, so concurrent requests meet."""
    worker = _tiny_worker(
        session_services,
        models_dir,
        {
            "SIE_MAX_LORAS_PER_MODEL": "2",
            "SIE_ADAPTIVE_BATCHING": "false",
            "SIE_MAX_BATCH_WAIT_MS": "300",
            "SIE_PRELOAD_MODELS": f"{LORA_MODEL},test/tiny-colbert",
        },
    )
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url)


class MotoProcess(ChildProcess):
    """moto in server mode: an S3-compatible server on loopback."""

    name = "moto"

    def __init__(self, log_path: Path) -> None:
        super().__init__(log_path)
        self.port = free_port()
        self._spawn([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)])


@pytest.fixture(scope="session")
def s3_server(session_services: Services) -> Iterator[S3Server]:
    """A real S3-compatible server (moto in server mode) on loopback; AWS_* test credentials in the environment."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1", AWS_MAX_ATTEMPTS="2"
    )
    moto = session_services.keep(MotoProcess(session_services.log_path("moto")))
    server = S3Server(f"http://127.0.0.1:{moto.port}")
    deadline = time.monotonic() + 60
    while True:
        try:
            server.client().list_buckets()
            break
        except Exception:
            if moto.exit_code() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield server


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory, session_services: Services) -> EtcdProcess:
    """One real etcd on loopback for the session; tests keep apart by key prefix."""
    root = tmp_path_factory.mktemp("etcd")
    server = session_services.keep(EtcdProcess(root / "data", root / "etcd.log"))
    server.start()
    return server


@pytest.fixture
def etcd_prefix() -> str:
    return f"/sie-test-{uuid.uuid4().hex[:8]}/"


@pytest.fixture
async def etcd(etcd_server: EtcdProcess, etcd_prefix: str) -> AsyncIterator[Etcd]:
    """A client of the session etcd under this test's prefix."""
    client = Etcd([etcd_server.endpoint], etcd_prefix)
    await client.connect()
    yield client
    await client.close()


@pytest.fixture
def start_config(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdProcess, etcd_prefix: str
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `sie-config serve` replicas on this test's prefix; all are stopped when the test ends."""
    started: list[WorkerProcess] = []

    def start(**env: str) -> WorkerProcess:
        log = tmp_path_factory.mktemp("config-logs") / "config.log"
        # Loopback replicas: tests add models without an admin token unless they set SIE_ADMIN_TOKEN.
        defaults = {
            "SIE_ETCD_ENDPOINTS": etcd_server.endpoint,
            "SIE_ETCD_PREFIX": etcd_prefix,
            "SIE_CONFIG_LEADER_TTL_S": "3",
            "SIE_ALLOW_UNAUTHENTICATED_ADMIN": "true",
        }
        replica = WorkerProcess({**defaults, **env}, log, module="sie_config")
        started.append(replica)
        replica.wait_serving(timeout_s=60)
        return replica

    yield start
    stop_all(started)


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: EtcdProcess, etcd_prefix: str, tiny_models: dict[str, Path], start_config):
    """Config service with the tiny models added; start workers and gateways with cluster.start_*()."""
    from local_cluster import Cluster, model_config

    models = [model_config(model_id, tiny_models[model_id]) for model_id in ("test/tiny-mean", "test/tiny-cls")]
    running = Cluster(tmp_path, etcd_server.endpoint, etcd_prefix, models, start_config)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def edge(tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdProcess, tiny_models) -> Iterator[Edge]:
    """The HTTP edge, shared by the session: a config service (admin token), one worker with the tiny models of each
    operation, a gateway and Envoy in front. Tests may add models to it, never change or stop its processes."""
    with running_edge(tmp_path_factory.mktemp("edge"), etcd_server.endpoint, tiny_models) as running:
        yield running


@pytest.fixture(scope="session")
def auth_edge(tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdProcess, tiny_models) -> Iterator[Edge]:
    """The HTTP edge of `edge` with a gateway that wants a token (static auth, `AUTH_TOKEN`), shared by the session."""
    with running_edge(
        tmp_path_factory.mktemp("auth-edge"),
        etcd_server.endpoint,
        tiny_models,
        SIE_AUTH_MODE="static",
        SIE_AUTH_TOKENS=AUTH_TOKEN,
    ) as running:
        yield running

