"""Generate, check, lint and compare the protobuf contract in proto/.

    python tools/protos.py generate          # write contract/python (stubs + descriptor set) from proto/
    python tools/protos.py check             # fail if contract/python drifted from proto/
    python tools/protos.py lint              # buf lint
    python tools/protos.py breaking [REF]    # buf breaking against a git ref (default: main)

The googleapis protos the contract imports (google/api, google/rpc) are taken
from the installed googleapis-common-protos package, never vendored.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"
PYTHON_OUT = ROOT / "contract" / "python"
# The generated package inside the contract's distribution; its other package (sie_contract) is written by hand.
GENERATED = "sie"
DEPS_DIR = ROOT / "build" / "proto-deps"
DESCRIPTOR_NAME = "sie.binpb"
GOOGLEAPIS_FILES = (
    "google/api/annotations.proto",
    "google/api/http.proto",
    "google/rpc/status.proto",
)


def googleapis_include() -> Path:
    from google.api import annotations_pb2

    return Path(annotations_pb2.__file__).resolve().parents[2]


def protobuf_include() -> Path:
    import grpc_tools

    return Path(grpc_tools.__file__).resolve().parent / "_proto"


def proto_files(root: Path) -> list[Path]:
    return sorted(root.glob("sie/**/*.proto"))


def generate(out: Path) -> None:
    from grpc_tools import protoc

    (out / "sie").mkdir(parents=True, exist_ok=True)
    files = [str(p.relative_to(PROTO_DIR)) for p in proto_files(PROTO_DIR)]
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{googleapis_include()}",
        f"-I{protobuf_include()}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    # The descriptor set Envoy's gRPC-JSON transcoder reads (shipped in the `sie` package). It also
    # holds google.rpc's error details, so Envoy can print ErrorInfo/RetryInfo in JSON error bodies.
    descriptor = [
        *args[:4],
        "--include_imports",
        f"--descriptor_set_out={out / 'sie' / DESCRIPTOR_NAME}",
        *files,
        "google/rpc/error_details.proto",
    ]
    if protoc.main(args) != 0 or protoc.main(descriptor) != 0:
        raise SystemExit("protoc failed")
    for package in {p.parent for p in out.glob("sie/**/*_pb2.py")} | {out / "sie"}:
        (package / "__init__.py").touch()


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        drift = _compare(fresh / GENERATED, PYTHON_OUT / GENERATED)
    if drift:
        print("generated stubs differ from proto/; run `make protos`:", file=sys.stderr)
        for name in drift:
            print(f"  {name}", file=sys.stderr)
        return 1
    print("generated stubs match proto/")
    return 0


def _compare(fresh: Path, committed: Path) -> list[str]:
    fresh_files = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    committed_files = {
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    drift = sorted(str(p) for p in fresh_files ^ committed_files)
    drift += sorted(
        str(p) for p in fresh_files & committed_files if not filecmp.cmp(fresh / p, committed / p, shallow=False)
    )
    return drift


def stage_googleapis(deps: Path) -> None:
    source = googleapis_include()
    for name in GOOGLEAPIS_FILES:
        target = deps / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target)


def buf(*args: str, cwd: Path = ROOT) -> int:
    return subprocess.run([_buf_binary(), *args], cwd=cwd, check=False).returncode


def _buf_binary() -> str:
    found = shutil.which("buf", path=str(Path(sys.executable).parent)) or shutil.which("buf")
    if not found:
        raise SystemExit("buf not found: install the test extras (pip install -e '.[test]')")
    return found


def lint() -> int:
    stage_googleapis(DEPS_DIR)
    return buf("lint")


def breaking(against: str) -> int:
    """buf breaking against the contract at a git ref, staged with the same deps."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(
            ["git", "archive", against, "proto", "buf.yaml"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        return breaking_between(ROOT, base)


def breaking_between(current: Path, against: Path) -> int:
    """buf breaking of the workspace at `current` against the one at `against`."""
    for workspace in (current, against):
        stage_googleapis(workspace / "build" / "proto-deps")
    return buf("breaking", "--against", str(against), cwd=current)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("generate", help="write contract/python from proto/")
    commands.add_parser("check", help="fail if contract/python drifted from proto/")
    commands.add_parser("lint", help="buf lint")
    against = commands.add_parser("breaking", help="buf breaking against a git ref")
    against.add_argument("ref", nargs="?", default="main")
    args = parser.parse_args(argv)
    if args.command == "generate":
        shutil.rmtree(PYTHON_OUT / GENERATED, ignore_errors=True)
        generate(PYTHON_OUT)
        return 0
    if args.command == "check":
        return check()
    if args.command == "lint":
        return lint()
    return breaking(args.ref)


if __name__ == "__main__":
    sys.exit(main())
