#!/usr/bin/env bash
# GPU check: run on a machine with a CUDA GPU (one command, under 10 minutes).
#  1. the training loop on CUDA, fp32 and bf16 autocast, against a hand-written loop;
#  2. `dbspec run` with compute.kind single_gpu and bf16 on the monitoring spec;
#  3. `dbspec run` with compute.kind torch_distributor, use_gpu: true, nccl, one process per GPU.
# It assumes a CUDA build of torch is installed; it installs dbspec's other dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'; \
print('GPU:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
python -m pip install --quiet -e ".[train,spark]"
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
work=$(mktemp -d)
echo "== training loop on CUDA (samples/s vs a hand-written loop)"
python benchmarks/train_overhead.py --device cuda --precision fp32 --rows 1000000 --epochs 3
python benchmarks/train_overhead.py --device cuda --precision bf16 --rows 1000000 --epochs 3
echo "== dbspec run, single_gpu, bf16"
(cd "$work" && dbspec run "$OLDPWD/specs/monitoring_synthetic.yaml" -q \
  --set compute.kind=single_gpu --set training.precision=bf16 --set training.epochs=3 \
  --summary-json single_gpu.json)
python -c "import json; d=json.load(open('$work/single_gpu.json')); \
print('single_gpu', d['training'], 'test_roc_auc', d['metrics'].get('test_roc_auc'))"
echo "== dbspec run, torch_distributor, nccl, $gpus process(es)"
cp specs/monitoring_synthetic.yaml "$work/ddp.yaml"
cat >> "$work/ddp.yaml" <<YAML
compute: {kind: torch_distributor, num_processes: $gpus, use_gpu: true, backend: nccl}
YAML
(cd "$work" && dbspec run ddp.yaml -q --set training.epochs=3 --summary-json ddp.json)
python -c "import json; d=json.load(open('$work/ddp.json')); \
print('torch_distributor', d['training'], 'test_roc_auc', d['metrics'].get('test_roc_auc'))"
