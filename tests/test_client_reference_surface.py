"""Every public name of the reference SDK (sie-sdk 0.10.1, installed from PyPI into its own Python 3.12 venv) that a
user of the surface shared/seeds describe imports (encode, score, extract, models, pools, capacity, timing, the
error classes) exists in sie_client, in the module of the same name, with the same signature: each reference
parameter under its name, of its kind, in its place and with its default (ours may add keyword-only ones with
defaults); the same keys in each TypedDict (ours may add keys); the same bases among the reference's classes, and no
reference class as a base the reference's has not (so `except RequestError` catches the same errors).

The names left out are listed below, each with why: features of the reference beyond that surface (generation,
chat, jobs, files, batches, billing, status streams). A new reference name fails the test until it is added to
sie_client or to that list. Both sides are described by one function (tests/reference_sdk_names.py), run in the
reference's venv for its side and here for ours."""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reference_sdk import reference_python
from reference_sdk_names import MODULES, describe

# Starts processes (the reference SDK's own Python) in fixtures of its own.
pytestmark = pytest.mark.process

NAMES_SCRIPT = Path(__file__).parent / "reference_sdk_names.py"

BEYOND_THE_SEEDS = "a reference feature beyond the surface shared/seeds describe; this engine has none"
GENERATION = f"text generation and chat: {BEYOND_THE_SEEDS}"
JOBS = f"batch jobs, files, batches and connectors: {BEYOND_THE_SEEDS}"
BILLING = f"the hosted service's metering, rates and estimates: {BEYOND_THE_SEEDS}"
STATUS = "the types of the status stream of watch(), which raises NotSupportedError here (no status stream)"
HEALTH = (
    "the /health answer's types: get_capacity() returns CapacityInfo, built from the models and pools the API lists"
)
LEFT_OUT = {
    **dict.fromkeys(
        [
            "ChatCompletion",
            "ChatCompletionChunk",
            "ChatMessage",
            "ChatUsage",
            "ChatChoice",
            "ChatChunkChoice",
            "ChatContentPart",
            "ChatDelta",
            "ChatImageURL",
            "ChatVideoURL",
            "ChatRole",
            "ChatFinishReason",
            "GenerateChunk",
            "GenerateChunkError",
            "GenerateImage",
            "GenerateResult",
            "GenerationUsage",
            "GenerateGrammar",
            "JsonSchemaGrammar",
            "RegexGrammar",
            "EbnfGrammar",
            "FinishReason",
            "PromptTokensDetails",
            "ResponseInputContentPart",
            "ResponseInputMessage",
            "ResponseInputRole",
            "ResponseOutputMessage",
            "ResponseOutputText",
            "ResponseResult",
            "ResponseUsage",
            "PendingGeneration",
            "PendingGenerationGroup",
        ],
        GENERATION,
    ),
    **dict.fromkeys(
        [
            "Batch",
            "BatchList",
            "BatchRequestCounts",
            "Connection",
            "ConnectionCreated",
            "ConnectionRevoked",
            "File",
            "FileDeleted",
            "FileList",
            "JobChunk",
            "JobFieldMap",
            "JobItemErrorDetail",
            "JobList",
            "JobPreflight",
            "JobResultItem",
            "JobResults",
            "JobState",
            "JobStatus",
            "JobSubmitResult",
            "MalformedChunkError",
            "build_job_body",
            "connection_name",
            "resolve_upload",
            "ConnectorJobAttempt",
            "ConnectorJobCapabilities",
            "ConnectorJobCheckpoint",
            "ConnectorJobItemOutcomes",
            "ConnectorJobOverlapOwner",
            "ConnectorJobPlan",
            "ConnectorJobPublication",
            "ConnectorJobRecovery",
            "ConnectorJobRepairWindow",
            "ConnectorJobValidation",
            "ConnectorPlanOutputShape",
        ],
        JOBS,
    ),
    **dict.fromkeys(
        [
            "AppliedRate",
            "CostEstimate",
            "RateIdentity",
            "Recommendation",
            "RecommendedChoice",
            "RequestMetadata",
            "RequestUsage",
            "DECLARED_USAGE_FIELDS",
            "SETTLED_CHARGE_FIELDS",
            "TERMINAL_UNIT_FIELDS",
            "NumericalAdmissionObservation",
            "NumericalProcessInventory",
            "NumericalProcessObservation",
            "NumericalProfileObservation",
            "NumericalProfileSnapshot",
        ],
        BILLING,
    ),
    **dict.fromkeys(
        [
            "StatusMessage",
            "WorkerStatusMessage",
            "ClusterStatusMessage",
            "ServerInfo",
            "GPUMetrics",
            "ModelConfig",
            "AdaptiveBatchingStatus",
            "ModelStatus",
        ],
        STATUS,
    ),
    **dict.fromkeys(["HealthResponse", "ClusterSummary", "ModelSummary", "ClusterModelInfo", "PoolListItem"], HEALTH),
}
# Result keys of the features above (the hosted service's request metering, generation queues, process diagnostics).
LEFT_OUT_KEYS = {
    "request": f"RequestMetadata: {BILLING}",
    "pending_generation": GENERATION,
    "numerical_process_inventory": f"remote-execution diagnostics: {BILLING}",
}
LEFT_OUT_METHODS = {
    **dict.fromkeys(
        ["generate", "stream_generate", "chat_completions", "stream_chat_completions", "responses"], GENERATION
    ),
    **dict.fromkeys(["estimate", "recommend"], BILLING),
    "last_model_revision": "the reference server's model revision header: this engine sends none",
    "last_retry_count": "per-thread retry accounting of the reference's benchmarks: not part of the seeds' surface",
}


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, Any]]:
    python, why_not = reference_python()
    if python is None:
        pytest.skip(why_not)
    listed = subprocess.run([python, str(NAMES_SCRIPT)], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(listed.stdout)


def ours(module: str) -> Any:
    return importlib.import_module(module.replace("sie_sdk", "sie_client", 1))


def parameter_differences(where: str, theirs: list[dict], mine: list[dict] | None) -> list[str]:
    if mine is None:
        return [f"{where}: no signature"]
    problems = []
    positional = [p for p in mine if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    by_name = {p["name"]: p for p in mine}
    variadic = {p["kind"] for p in mine} & {"VAR_POSITIONAL", "VAR_KEYWORD"}
    for place, parameter in enumerate(theirs):
        if parameter["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):  # the name of *args / **kwargs is no caller's
            if parameter["kind"] not in variadic:
                problems.append(f"{where}: takes no {parameter['kind']}")
            continue
        found = by_name.get(parameter["name"])
        if found is None:
            problems.append(f"{where}: no parameter {parameter['name']!r}")
            continue
        if found["kind"] != parameter["kind"]:
            problems.append(f"{where}: {parameter['name']} is {found['kind']}, the reference's {parameter['kind']}")
        elif parameter["kind"] != "KEYWORD_ONLY" and positional.index(found) != place:
            problems.append(f"{where}: {parameter['name']} is at place {positional.index(found)}, not {place}")
        if found["default"] != parameter["default"]:
            problems.append(f"{where}: {parameter['name']} defaults to {found['default']}, not {parameter['default']}")
    known = {p["name"] for p in theirs}
    problems += [
        f"{where}: extra parameter {p['name']!r} is not keyword-only with a default"
        for p in mine
        if p["name"] not in known
        and p["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD")
        and (p["kind"] != "KEYWORD_ONLY" or not p["default"])
    ]
    return problems


def differences(where: str, theirs: dict[str, Any], value: Any) -> list[str]:
    mine = describe(value)
    if theirs["kind"] in ("alias", "value", "module"):
        return []  # a type alias or constant: that it exists is what a user's import needs
    if mine["kind"] != theirs["kind"]:
        return [f"{where}: a {mine['kind']}, the reference's is a {theirs['kind']}"]
    if theirs["kind"] == "typeddict":
        return [
            f"{where}: no key {key!r}" for key in theirs["keys"] if key not in mine["keys"] and key not in LEFT_OUT_KEYS
        ]
    if theirs["kind"] == "function":
        return parameter_differences(where, theirs["parameters"], mine["parameters"])
    if theirs["kind"] == "class":
        problems = []
        for name, method in theirs["methods"].items():
            if name in LEFT_OUT_METHODS or (method["kind"] == "method" and method["parameters"] is None):
                continue  # left out, or a builtin's (Exception.add_note, ...) with no signature to compare
            if name not in mine["methods"]:
                problems.append(f"{where}.{name}: missing")
            elif method["kind"] == "method":
                problems += parameter_differences(
                    f"{where}.{name}", method["parameters"], mine["methods"][name].get("parameters")
                )
        return problems
    return []


def test_every_reference_name_in_scope_exists_with_its_signature(reference: dict[str, dict[str, Any]]) -> None:
    assert set(reference) == set(MODULES)
    problems = []
    for module, names in reference.items():
        mine = ours(module)
        for name, theirs in names.items():
            if name in LEFT_OUT or name == "TYPE_CHECKING":
                continue
            if not hasattr(mine, name):
                problems.append(f"{module}.{name}: missing from {mine.__name__}")
                continue
            problems += differences(f"{mine.__name__}.{name}", theirs, getattr(mine, name))
    assert problems == []


def test_error_classes_have_the_reference_bases_and_no_others(reference: dict[str, dict[str, Any]]) -> None:
    """`except X` catches the same errors: ours subclasses each reference class the reference's does, and no
    reference class that it does not."""
    errors = {
        name: theirs for name, theirs in reference["sie_sdk"].items() if name.endswith("Error") and name not in LEFT_OUT
    }
    problems = []
    for name, theirs in errors.items():
        for other in errors:
            expected = other == name or any(base.endswith(f".{other}") for base in theirs["bases"])
            actual = issubclass(getattr(ours("sie_sdk"), name), getattr(ours("sie_sdk"), other))
            if expected != actual:
                problems.append(f"{name} {'is' if actual else 'is not'} a {other}")
    assert problems == []


def test_left_out_names_are_the_reference_s(reference: dict[str, dict[str, Any]]) -> None:
    """A name in the left-out list that the reference no longer has would hide nothing: keep the list exact."""
    listed = reference
    every = {name for names in listed.values() for name in names}
    methods = {method for cls in ("SIEClient", "SIEAsyncClient") for method in listed["sie_sdk"][cls]["methods"]}
    assert set(LEFT_OUT) - every == set()
    assert set(LEFT_OUT_METHODS) - methods == set()
