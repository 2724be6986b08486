#!/usr/bin/env bash
# GPU check of model.pretrained (issue 36): run on a machine with a CUDA GPU, from the
# repository root, one command (a few minutes). Needs a CUDA torch and dbspec[train,finetune]
# (transformers, peft) installed there already: nothing is downloaded, the checkpoint is
# specs/data/tiny_bert. What it checks:
#  1. LoRA on single_gpu with bf16 autocast and gradient checkpointing: the run ends, reports
#     the trained share, and the logged model scores raw text through mlflow.pyfunc on CPU;
#  2. the same with fp16 (GradScaler path) and full fine-tuning with a frozen embedding;
#  3. DeepSpeed ZeRO-3 with one process per GPU (if deepspeed is installed): the ranks build
#     the checkpoint's network with its adapters, and rank 0's gathered weights merge.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
python -c "import torch, transformers, peft; assert torch.cuda.is_available(), 'no CUDA GPU'; \
print('GPU:', torch.cuda.get_device_name(0), 'bf16', torch.cuda.is_bf16_supported(), \
'torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
work=$(mktemp -d)
ln -s "$PWD/specs" "$work/specs"
run() {  # name, then --set assignments
  local name=$1; shift
  (cd "$work" && python -m dbspec run specs/text_finetune.yaml -q --summary-json "$name.json" \
     --state-dir "$work/$name" --set compute.kind=single_gpu "$@" 2>&1 | grep -E "trained|error" || true)
  python -c "import json; d=json.load(open('$work/$name.json')); \
print('$name', d['training'], 'test_accuracy', d['metrics'].get('test_accuracy'))"
}
echo "== LoRA, single_gpu, bf16, gradient checkpointing"
run lora_bf16 --set training.precision=bf16 --set model.pretrained.gradient_checkpointing=true
echo "== LoRA, single_gpu, fp16"
run lora_fp16 --set training.precision=fp16
echo "== full fine-tuning, frozen embeddings, bf16"
sed -e 's/    finetune: {method: lora.*/    finetune: full\n    freeze: [bert.embeddings]/' \
  specs/text_finetune.yaml > "$work/full.yaml"
(cd "$work" && python -m dbspec run full.yaml -q --set compute.kind=single_gpu \
  --set training.precision=bf16 --summary-json full.json 2>&1 | grep -E "trained|error" || true)
echo "== the logged LoRA model scores raw text on CPU (pyfunc)"
(cd "$work" && CUDA_VISIBLE_DEVICES= python - <<'PY'
import json, os, mlflow, pandas as pd
d = json.load(open("lora_bf16.json"))
mlflow.set_tracking_uri(f"sqlite:///{os.getcwd()}/lora_bf16/mlflow.db")
model = mlflow.pyfunc.load_model(f"models:/{d['model_name']}/{d['model_version']}")
print(model.predict(pd.DataFrame({"text": ["The mopa kilded the zuto.", ""]})))
PY
)
if python -c "import deepspeed" 2>/dev/null; then
  echo "== DeepSpeed ZeRO-3, $gpus process(es)"
  cp specs/text_finetune.yaml "$work/zero3.yaml"
  echo "compute: {kind: deepspeed, num_gpus: $gpus, zero_stage: 3}" >> "$work/zero3.yaml"
  (cd "$work" && python -m dbspec run zero3.yaml -q --summary-json zero3.json 2>&1 \
     | grep -E "trained|error" || true)
  python -c "import json; d=json.load(open('$work/zero3.json')); print('zero3', d['training'])"
fi
