#!/usr/bin/env bash
# GPU check of model.pretrained (issue 36), on a machine with one or more CUDA GPUs, from the
# repository root, one command (a few minutes). Needs a CUDA torch, transformers and peft there,
# and dbspec's other dependencies (mlflow-skinny with sqlalchemy and alembic, pydantic, optuna);
# nothing is downloaded: the checkpoint is specs/data/tiny_bert. Where the machine lacks
# packages, wheels in ./.whl are installed to /tmp/site first (no index, no dependencies);
# made on a machine with an index, for the GPU machine's Python (3.12 on the H200 here):
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
#     -d .whl mlflow-skinny==3.17.2 pydantic sqlalchemy alembic databricks-sdk optuna
# then delete the wheels of packages the machine has (numpy, pyyaml, protobuf, requests,
# click...): 20 MB remained here, cryptography included (MLflow's SQLite store imports it).
# What it checks, each step with its own time limit, all output also in $OUT/log when set:
#  1. LoRA on single_gpu with bf16 autocast and gradient checkpointing: the run ends, reports
#     the trained share and the device, and the logged model scores raw text through
#     mlflow.pyfunc on the CPU (CUDA hidden);
#  2. the same with fp16 (the GradScaler path);
#  3. full fine-tuning with a frozen embedding, bf16;
#  4. serverless_gpu (AI Runtime's kind) with one accelerator: trains on this machine's GPU;
#  5. benchmarks/finetune_vs_hf.py on the GPU (bf16, a 256-wide 4-layer BERT): dbspec's
#     samples/s against the same fine-tuning written with Transformers and peft.
# DeepSpeed is not run: compute.kind deepspeed starts its ranks through pyspark's
# DeepspeedTorchDistributor (Java), and serverless_gpu's ZeRO needs a GPU per rank.
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/log
exec > >(tee "$log") 2>&1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=false
python3 -c "import torch, transformers, peft, mlflow, pydantic; \
assert torch.cuda.is_available(), 'no CUDA GPU'; \
print('GPU:', torch.cuda.get_device_name(0), '| bf16', torch.cuda.is_bf16_supported(), \
'| torch', torch.__version__, '| transformers', transformers.__version__, '| peft', \
peft.__version__, '| mlflow', mlflow.__version__)" || exit 1
work=$(mktemp -d)
ln -s "$PWD/specs" "$work/specs"
show() {  # name: the run's summary, in one line
  python3 -c "import json; d=json.load(open('$work/$1.json')); \
print('$1: promotion', d.get('promotion'), '| training', d.get('training'), '| test_accuracy', \
d.get('metrics', {}).get('test_accuracy'))" || echo "$1: no summary"
}
run() {  # name, spec, then dbspec run options
  local name=$1 spec=$2; shift 2
  local start=$SECONDS
  (cd "$work" && timeout 240 python3 -m dbspec run "$spec" --summary-json "$name.json" \
     --state-dir "$work/$name" "$@" 2>&1 | grep -E "trained|device|cuda|GPU|rror|Traceback" \
     | grep -v "^\s*$" | head -20)
  echo "$name took $((SECONDS - start)) s"
  show "$name"
}
echo "== 1. LoRA, single_gpu, bf16, gradient checkpointing"
run lora_bf16 specs/text_finetune.yaml --set compute.kind=single_gpu \
  --set training.precision=bf16 --set model.pretrained.gradient_checkpointing=true
echo "== 1b. the logged LoRA model scores raw text on the CPU (mlflow.pyfunc)"
(cd "$work" && CUDA_VISIBLE_DEVICES= timeout 120 python3 - <<'PY'
import json, os, mlflow, pandas as pd
d = json.load(open("lora_bf16.json"))
mlflow.set_tracking_uri(f"sqlite:///{os.getcwd()}/lora_bf16/mlflow.db")
model = mlflow.pyfunc.load_model(f"models:/{d['model_name']}/{d['model_version']}")
print(model.predict(pd.DataFrame({"text": ["The mopa kilded the zuto.", "", "zuto mopa"]})))
PY
)
echo "== 2. LoRA, single_gpu, fp16"
run lora_fp16 specs/text_finetune.yaml --set compute.kind=single_gpu \
  --set training.precision=fp16
echo "== 3. full fine-tuning, frozen embeddings, bf16"
sed -e 's/^    finetune: {method: lora.*/    finetune: {method: full}\n    freeze: [bert.embeddings]/' \
  specs/text_finetune.yaml > "$work/full.yaml"
run full full.yaml --set compute.kind=single_gpu --set training.precision=bf16 \
  --set training.optimizer.lr=0.001
echo "== 4. serverless_gpu (AI Runtime's kind), one accelerator, here"
cp specs/text_finetune.yaml "$work/serverless.yaml"
printf 'compute: {kind: serverless_gpu, accelerator: GPU_1xH100, count: 1}\n' \
  >> "$work/serverless.yaml"
run serverless serverless.yaml --set training.precision=bf16
echo "== 5. benchmark: dbspec against Transformers + peft by hand, on the GPU"
timeout 200 python3 benchmarks/finetune_vs_hf.py --device cuda --precision bf16 --hidden 256 \
  --layers 4 --repeats 2 2>&1 | grep -v "^\s*$" | tail -25
echo "== done"
