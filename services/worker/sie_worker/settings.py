"""Every knob of the worker, in one typed object (flags > SIE_* env > defaults)."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from sie_common.cluster.model_config import weight_packages_setting
from sie_common.edge.auth import check_auth_mode
from sie_common.edge.encode_stream import EncodeStreamSettings
from sie_common.edge.request_bounds import RequestBoundSettings
from sie_common.runtime.settings import ServiceSettings, SettingsError, metrics_port_setting, port_setting, setting

# What SIE_CPU_COMPUTE_PRECISION takes (sie_worker.models.cpu_precision).
CPU_PRECISIONS = ("auto", "float32", "bfloat16", "int8")


@dataclass(frozen=True)
class WorkerSettings(RequestBoundSettings, EncodeStreamSettings, ServiceSettings):
    host: str = setting(
        "127.0.0.1",
        env="SIE_HOST",
        help="address to listen on; any but loopback needs SIE_WORKER_TOKEN or SIE_TLS_CLIENT_CA_FILE (the images set "
        "0.0.0.0)",
    )
    port: int = port_setting(50061)
    worker_id: str = setting("", env="SIE_WORKER_ID", help="stable id in logs and answers (default: <hostname>:<port>)")
    device: str = setting("auto", env="SIE_DEVICE", help="auto, cpu, cuda, cuda:N or mps")
    models_dir: str = setting(
        "./models",
        env="SIE_MODELS_DIR",
        help="directory or s3://bucket/prefix of model YAML configs (added to the built-in ones)",
    )
    bundle: str = setting(
        "default",
        env="SIE_BUNDLE",
        help="bundle this worker serves: only models whose adapter the bundle runs (from SIE_MODELS_DIR and, with "
        "etcd, the config service)",
    )
    bundles_dir: str | None = setting(
        None, env="SIE_BUNDLES_DIR", help="directory of bundle YAML files (default: the repository's bundles/)"
    )
    model_filter: tuple[str, ...] = setting(
        (), env="SIE_MODEL_FILTER", help="comma-separated model ids to serve; unset serves all"
    )
    preload_models: tuple[str, ...] = setting(
        (), env="SIE_PRELOAD_MODELS", help="comma-separated model ids to load at start"
    )
    local_cache: str | None = setting(
        None, env="SIE_LOCAL_CACHE", help="local weight cache directory (default: the Hugging Face hub cache)"
    )
    cluster_cache: str | None = setting(
        None, env="SIE_CLUSTER_CACHE", help="s3://bucket/prefix shared by workers for weights"
    )
    s3_endpoint_url: str | None = setting(
        None, env="SIE_S3_ENDPOINT_URL", help="S3-compatible endpoint for s3:// URLs (default: AWS)"
    )
    hf_fallback: bool = setting(
        True, env="SIE_HF_FALLBACK", help="download from the Hugging Face Hub when no cache has the weights"
    )
    disk_cache_enabled: bool = setting(
        True,
        env="SIE_DISK_CACHE_ENABLED",
        help="remove least-recently-used local weights when the disk is over the threshold",
    )
    disk_pressure_threshold_percent: float = setting(
        85.0,
        env="SIE_DISK_PRESSURE_THRESHOLD_PERCENT",
        help="disk usage percent above which cached weights are removed",
    )
    memory_pressure_threshold_percent: float = setting(
        85.0,
        env="SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT",
        help="memory usage percent (of device memory, or of the CPU budget) above which models are evicted",
    )
    cpu_memory_budget_mb: float | None = setting(
        None,
        env="SIE_CPU_MEMORY_BUDGET_MB",
        help="on CPU: megabytes of model weights to keep loaded; 0 means no limit; unset: SIE_CPU_MEMORY_FRACTION of "
        "the machine's memory",
    )
    cpu_memory_fraction: float = setting(
        0.5,
        env="SIE_CPU_MEMORY_FRACTION",
        help="on CPU, when SIE_CPU_MEMORY_BUDGET_MB is unset: the budget as a share of the machine's memory "
        "(MemTotal, or the cgroup's limit when lower); 0 means no limit",
    )
    memory_check_interval_s: float = setting(
        5.0, env="SIE_MEMORY_CHECK_INTERVAL_S", help="how often the background monitor checks memory and idleness"
    )
    idle_evict_s: float = setting(0.0, env="SIE_IDLE_EVICT_S", help="unload models idle this long; 0 disables")
    load_retry_cooldown_s: float = setting(
        5.0, env="SIE_LOAD_RETRY_COOLDOWN_S", help="wait after a retryable load failure, doubled per failure in a row"
    )
    drain_timeout_s: float = setting(
        30.0, env="SIE_DRAIN_TIMEOUT_S", help="on SIGTERM, how long in-flight requests get to finish"
    )
    max_batch_requests: int = setting(
        64,
        env="SIE_MAX_BATCH_REQUESTS",
        help="most items in one forward pass, whichever requests they come from (the name is the reference system's)",
    )
    max_batch_wait_ms: float = setting(
        10.0,
        env="SIE_MAX_BATCH_WAIT_MS",
        help="longest an item waits for its batch to fill when batching is not adaptive; the adaptive controller "
        "starts from it",
    )
    max_batch_tokens: int = setting(
        16384,
        env="SIE_MAX_BATCH_TOKENS",
        help="token budget of one forward pass (padded); a profile's max_batch_tokens overrides it",
    )
    adaptive_batching: bool = setting(
        True,
        env="SIE_ADAPTIVE_BATCHING",
        help="adapt the batch wait and budget for model profiles that do not set adaptive_batching; false: the fixed "
        "SIE_MAX_BATCH_WAIT_MS",
    )
    adaptive_min_quantum_ms: float = setting(
        2.0,
        env="SIE_ADAPTIVE_MIN_QUANTUM_MS",
        help="adaptive batching: the shortest batch wait the controller sets while batching gathers anything; under "
        "light load it turns the wait off (0) instead",
    )
    adaptive_max_quantum_ms: float = setting(
        15.0, env="SIE_ADAPTIVE_MAX_QUANTUM_MS", help="adaptive batching: the longest batch wait the controller sets"
    )
    adaptive_target_p50_ms: float = setting(
        50.0,
        env="SIE_ADAPTIVE_TARGET_P50_MS",
        help="adaptive batching: p50 batching latency (queue + forward pass) to track; 0 derives it from the "
        "measured forward time",
    )
    instrumentation: bool = setting(
        False,
        env="SIE_INSTRUMENTATION",
        help="per-batch statistics as metrics, and in responses to requests that set debug",
    )
    max_concurrent_requests: int = setting(
        512, env="SIE_MAX_CONCURRENT_REQUESTS", help="requests in flight before RESOURCE_EXHAUSTED"
    )
    preprocessor_workers: int = setting(
        4, env="SIE_PREPROCESSOR_WORKERS", help="threads for tokenization and postprocessing"
    )
    image_workers: int = setting(
        4, env="SIE_IMAGE_WORKERS", help="threads that decode and preprocess images (resize, crop, normalize)"
    )
    max_image_pixels: int = setting(
        40_000_000,
        env="SIE_MAX_IMAGE_PIXELS",
        help="largest image accepted, in pixels (width x height, read from the header before decoding), and largest "
        "size the model's processor may resize one to",
    )
    max_request_image_pixels: int = setting(
        200_000_000,
        env="SIE_MAX_REQUEST_IMAGE_PIXELS",
        help="most pixels one request's images may take together, each counted as decoded plus as the model's "
        "processor resizes it (read from the headers before decoding): a processed pixel takes 12 bytes (3 float32)",
    )
    # Upper bounds on request fields that need the model (sie_worker.engine.limits; docs/security.md "Bounds"); those
    # the
    # gateway checks too come from RequestBoundSettings.
    max_image_aspect_ratio: float = setting(
        50.0,
        env="SIE_MAX_IMAGE_ASPECT_RATIO",
        help="largest ratio of an image's long edge to its short edge (read from the header before decoding)",
    )
    max_jpeg_scans: int = setting(
        100,
        env="SIE_MAX_JPEG_SCANS",
        help="most scans (SOS markers) a JPEG may have; libjpeg decodes every scan over the whole image, so a small "
        "progressive file of thousands of empty scans takes minutes of CPU",
    )
    max_muvera_repetitions: int = setting(
        64,
        env="SIE_MAX_MUVERA_REPETITIONS",
        help="largest MUVERA repetitions accepted (request options merged over the profile's)",
    )
    max_muvera_d_proj: int = setting(1024, env="SIE_MAX_MUVERA_D_PROJ", help="largest MUVERA d_proj accepted")
    max_muvera_dims: int = setting(
        16384, env="SIE_MAX_MUVERA_DIMS", help="widest MUVERA encoding accepted: repetitions x 2^k_sim x d_proj"
    )
    max_score_multivector_bytes: int = setting(
        2**30,
        env="SIE_MAX_SCORE_MULTIVECTOR_BYTES",
        help="most bytes of float32 multivectors a score's items may take (ColBERT scores, BGE-M3 multivector and "
        "hybrid scores), counted from their tokens before the forward pass; more gets INVALID_ARGUMENT; an "
        "encode's multivectors, MUVERA's included, within it too",
    )
    max_request_timeout_s: float = setting(
        3600.0,
        env="SIE_MAX_REQUEST_TIMEOUT_S",
        help="longest timeout a Work request may carry; longer ones are cut to it",
    )
    default_compute_precision: str = setting(
        "float16",
        env="SIE_DEFAULT_COMPUTE_PRECISION",
        help="float16, bfloat16 or float32 on accelerators when the profile sets none (a profile's int8 runs in it "
        "too)",
    )
    cpu_compute_precision: str = setting(
        "auto",
        env="SIE_CPU_COMPUTE_PRECISION",
        help="auto, float32, bfloat16 or int8 on a CPU when the profile sets none; auto: bfloat16 on AMX CPUs, else "
        "float32; a precision the CPU lacks (bfloat16: AVX512-BF16 or AMX; int8: VNNI) runs in float32",
    )
    cpu_flags: str | None = setting(
        None,
        env="SIE_CPU_FLAGS",
        help="space-separated ISA flags that stand for /proc/cpuinfo's when choosing a CPU precision (tests; "
        "containers that hide them)",
    )
    precision_min_cosine: float = setting(
        0.999,
        env="SIE_PRECISION_MIN_COSINE",
        help="a reduced-precision CPU model whose probe outputs have a cosine to float32's below this (a "
        "cross-encoder's: a correlation) is loaded in float32 instead",
    )
    int8_max_drift: float = setting(
        1e-5,
        env="SIE_INT8_MAX_DRIFT",
        help="int8 on a CPU: how far (summed 1 - cosine to float32 on the calibration probe) the Linear layers put "
        "in int8 may move a model's outputs; layers are taken least harmful first, the rest run bfloat16 matmuls "
        "(float32 without AVX512-BF16/AMX); 0: none in int8",
    )
    max_loras_per_model: int = setting(
        10,
        env="SIE_MAX_LORAS_PER_MODEL",
        help="LoRA adapters kept loaded per model; the least recently used is evicted",
    )
    attention_backend: str = setting("auto", env="SIE_ATTENTION_BACKEND", help="auto, flash_attention_2, sdpa or eager")
    cpu_onednn: bool = setting(
        True,
        env="SIE_CPU_ONEDNN",
        help="float32 models on a CPU run their Linear layers on oneDNN-packed weights (BERT-style GELU fused in); "
        "false: plain PyTorch",
    )
    cpu_unpadded: bool = setting(
        True,
        env="SIE_CPU_UNPADDED",
        help="BERT-family embedders and rerankers on a CPU compute on real tokens only, skipping padding; false: "
        "padded batches as transformers runs them",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        (),
        env="SIE_ETCD_ENDPOINTS",
        help="comma-separated etcd endpoints; when set, models the config service adds for this worker's bundle are "
        "served live",
    )
    advertise_address: str | None = setting(
        None,
        env="SIE_ADVERTISE_ADDRESS",
        help="host:port gateways use to reach this worker (default: SIE_HOST:port, or hostname:port when listening "
        "on all addresses)",
    )
    machine_profile: str = setting(
        "default", env="SIE_MACHINE_PROFILE", help="machine-profile label gateways route on (x-sie-machine-profile)"
    )
    pool: str = setting(
        "",
        env="SIE_POOL",
        help="resource pool this worker is dedicated to; empty: shared, and assignable to pools created through the "
        "API",
    )
    gpu_count: int = setting(1, env="SIE_GPU_COUNT", help="GPU count advertised in the worker's registration")
    health_publish_interval_ms: int = setting(
        5000,
        env="SIE_HEALTH_PUBLISH_INTERVAL_MS",
        help="how often the worker's etcd registration is refreshed (loaded models, queue depth, capacity)",
    )
    worker_lease_ttl_s: int = setting(
        10,
        env="SIE_WORKER_LEASE_TTL_S",
        help="TTL of the lease the registration is bound to: a dead worker disappears from etcd within it",
    )
    worker_loop_stall_s: float = setting(
        20.0,
        env="SIE_WORKER_LOOP_STALL_S",
        help="how long the worker's event loop may go without running before the worker withdraws its registration "
        "(gateways send what they had sent it elsewhere); it registers again once the loop runs",
    )
    weight_packages: tuple[str, ...] = weight_packages_setting()
    weight_roots: tuple[str, ...] = setting(
        (),
        env="SIE_WEIGHT_ROOTS",
        help="comma-separated directories a model config's path and local LoRA directories must lie in (symlinks "
        "resolved); unset: the local cache, SIE_MODELS_DIR and the built-in models' package directories",
    )
    auth_mode: str = setting(
        "none",
        env="SIE_AUTH_MODE",
        help="none, or static: every Inference call on this worker needs a bearer token from SIE_AUTH_TOKENS (set "
        "them as on the gateways)",
    )
    auth_tokens: tuple[str, ...] = setting(
        (), env="SIE_AUTH_TOKENS", help="comma-separated bearer tokens accepted with SIE_AUTH_MODE=static"
    )
    worker_token: str | None = setting(
        None,
        env="SIE_WORKER_TOKEN",
        help="bearer token every Work stream must present (the gateways' SIE_WORKER_TOKEN); required with "
        "SIE_AUTH_MODE=static unless SIE_TLS_CLIENT_CA_FILE is set",
    )
    allow_open_work_stream: bool = setting(
        False,
        env="SIE_ALLOW_OPEN_WORK_STREAM",
        help="listen on an SIE_HOST other than loopback without SIE_WORKER_TOKEN or SIE_TLS_CLIENT_CA_FILE: anyone "
        "who reaches the port may open Work streams; only on a network where nothing else does",
    )
    allow_remote_code: bool = setting(
        False,
        env="SIE_ALLOW_REMOTE_CODE",
        help="load model configs from the config service (etcd) whose profile sets trust_remote_code; off: they fail "
        "with FAILED_PRECONDITION/REMOTE_CODE_DISABLED (files in SIE_MODELS_DIR may always set it)",
    )
    metrics_port: int = metrics_port_setting(9095, env="SIE_WORKER_METRICS_PORT")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_auth_mode(self.auth_mode, self.auth_tokens)
        if self.auth_mode == "static" and not self.worker_token and not self.tls_client_ca_file:
            raise SettingsError(
                "SIE_AUTH_MODE=static protects Inference but not the Work stream gateways open: set SIE_WORKER_TOKEN"
                " (and the same on the gateways), or SIE_TLS_CLIENT_CA_FILE for mutual TLS"
            )
        protected = self.worker_token or self.tls_client_ca_file or self.allow_open_work_stream
        if not protected and not self.loopback_only:
            raise SettingsError(
                f"SIE_HOST={self.host} lets other machines reach this worker, but nothing protects its Work stream "
                "(the gateways' link, which runs any request): set SIE_WORKER_TOKEN (the same on the gateways) or "
                "SIE_TLS_CLIENT_CA_FILE for mutual TLS; SIE_HOST=127.0.0.1 for this machine only; or, on a network "
                "where nothing else reaches the port, SIE_ALLOW_OPEN_WORK_STREAM=true"
            )
        if not 0 <= self.adaptive_min_quantum_ms <= self.adaptive_max_quantum_ms:
            raise SettingsError(
                f"SIE_ADAPTIVE_MIN_QUANTUM_MS={self.adaptive_min_quantum_ms} and "
                f"SIE_ADAPTIVE_MAX_QUANTUM_MS={self.adaptive_max_quantum_ms}:"
                " need 0 <= min <= max"
            )
        if not 0 <= self.cpu_memory_fraction <= 1:
            raise SettingsError(
                f"SIE_CPU_MEMORY_FRACTION={self.cpu_memory_fraction}: must be between 0 (no limit) and 1"
            )
        if self.cpu_memory_budget_mb is not None and self.cpu_memory_budget_mb < 0:
            raise SettingsError(
                f"SIE_CPU_MEMORY_BUDGET_MB={self.cpu_memory_budget_mb}: must be 0 (no limit) or positive"
            )
        if self.adaptive_target_p50_ms < 0:
            raise SettingsError(
                f"SIE_ADAPTIVE_TARGET_P50_MS={self.adaptive_target_p50_ms}: must be 0 (derived) or positive"
            )
        bounds = {name: getattr(self, name) for name in _POSITIVE_BOUNDS}
        for name, value in bounds.items():
            if not value > 0:  # NaN too
                raise SettingsError(f"{self.__dataclass_fields__[name].metadata['env']}={value}: must be positive")
        if self.cpu_compute_precision not in CPU_PRECISIONS:
            raise SettingsError(
                f"SIE_CPU_COMPUTE_PRECISION={self.cpu_compute_precision}: must be one of {', '.join(CPU_PRECISIONS)}"
            )
        if not -1 <= self.precision_min_cosine <= 1:  # NaN too: `agreement < NaN` would pass every probe
            raise SettingsError(f"SIE_PRECISION_MIN_COSINE={self.precision_min_cosine}: must be a cosine, -1 to 1")
        if not 0 <= self.int8_max_drift <= 2:  # NaN too
            raise SettingsError(f"SIE_INT8_MAX_DRIFT={self.int8_max_drift}: must be 0 to 2 (1 - cosine)")
        if self.max_image_aspect_ratio < 1:
            raise SettingsError(f"SIE_MAX_IMAGE_ASPECT_RATIO={self.max_image_aspect_ratio}: must be at least 1")
        if not self.worker_id:
            object.__setattr__(self, "worker_id", f"{socket.gethostname()}:{self.port}")


# The worker's own request bounds (sie_worker.engine.limits) that must be positive.
_POSITIVE_BOUNDS = (
    "max_image_pixels",
    "max_request_image_pixels",
    "max_jpeg_scans",
    "max_muvera_repetitions",
    "max_muvera_d_proj",
    "max_muvera_dims",
    "max_score_multivector_bytes",
    "max_request_timeout_s",
    "encode_stream_window",
    "max_encode_streams",
    "worker_loop_stall_s",
)
