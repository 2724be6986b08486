"""Does dbspec's LoRA fine-tuning train as fast as the same fine-tuning written by hand with
Transformers and peft, and to the same metric? (issue 36)

Both arms fine-tune the same checkpoint on the same rows of the generated text corpus of
``specs/text_finetune.yaml`` (``generator: text_words``, seed 7, split 0.15 / 0.15 seed 7), tokenized
by the checkpoint's tokenizer to the same ``max_length`` (the script checks that the two arms'
token ids are identical), with LoRA of the same rank, alpha, dropout and target modules, the
classification head and the pooler the masked-LM checkpoint lacks trained in full, AdamW at the
same learning rate, the same batch size, epochs and intra-op threads:

- dbspec: ``dbspec.training.fit.fit_spec`` -- the call the train stage of ``dbspec run`` makes
  -- on the outputs of ``dbspec run --only load_data,split,preprocess`` (run once, untimed).
  **Timed**: the ``dbspec.training.loop.train`` call inside it (every epoch: the shuffled
  batches, forward, BCE loss, backward, AdamW step, then the validation loss and the
  early-stopping / history bookkeeping), measured by wrapping that function. Not timed:
  loading the checkpoint, ``get_peft_model``, the preprocessed matrix's transform, the merge of
  the adapters after training, MLflow (not called: no tracker is passed).
- hand-written: ``AutoTokenizer`` / ``AutoModelForSequenceClassification.from_pretrained``
  (``num_labels=2``), ``peft.get_peft_model(LoraConfig(task_type=SEQ_CLS, r, lora_alpha,
  lora_dropout, target_modules, modules_to_save=["pooler"]))``, ``torch.optim.AdamW``, and the
  loop people write: ``randperm`` batches, ``model(input_ids, attention_mask, labels).loss``,
  backward, step; the validation loss each epoch. **Timed**: that loop (all epochs, with
  their validation passes); not timed: tokenizing, loading, wrapping.

Interleaved in one process, their order rotating each repeat; samples per wall second and per
CPU second of this process (the training rows times the epochs over the timed seconds), best
and median of the repeats; after the last repeat of each arm, the loss and accuracy of its
model on the held-out test split (dbspec: the served network, adapters merged; by hand: the
peft model). The ratio of the medians is printed last.

Options: ``--device cuda --precision bf16`` (dbspec: ``compute.device`` and
``training.precision``; by hand: ``torch.autocast``); ``--hidden 256 --layers 4`` fine-tunes a
larger BERT of random weights built here (the shipped tokenizer, ``BertForMaskedLM`` saved to a
temporary directory) instead of ``specs/data/tiny_bert``, so that compute, not per-step
overhead, dominates. Needs torch, transformers, peft and dbspec; runs offline
(``HF_HUB_OFFLINE=1`` is set).

Goal (issue 36): dbspec >= 0.95x the hand-written loop's samples/s, the metric within noise.
Run: ``python benchmarks/finetune_vs_hf.py [--rows 3000] [--epochs 2] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _results import conditions, load, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "specs" / "data" / "tiny_bert"
NAME = "finetune-bench"


class Speed(NamedTuple):
    """Training samples per wall second and per CPU second of this process."""

    wall: float
    cpu: float


class Result(NamedTuple):
    speed: Speed
    test_loss: float
    test_accuracy: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_checkpoint(out: Path, hidden: int, layers: int) -> Path:
    """A BERT of random weights, ``hidden`` wide and ``layers`` deep, with the tiny
    checkpoint's tokenizer (masked-LM head, as the shipped one: no pooler in it)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=600, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                        max_position_embeddings=64, pad_token_id=0)
    BertForMaskedLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / name, out / name)
    return out


def write_spec(project: Path, args, checkpoint: Path) -> Path:
    """specs/text_finetune.yaml with the benchmark's rows, sizes and device."""
    spec = {
        "name": NAME,
        "data": {"source": {"kind": "synthetic", "generator": args.generator, "rows": args.rows,
                            "classes": 2, "noise": 0.05, "seed": 7},
                 "task": "binary", "target": "target",
                 "features": [{"name": "text", "type": "text", "tokenizer": "checkpoint",
                               "max_length": args.max_length}],
                 "split": {"validation": 0.15, "test": 0.15, "seed": 7}},
        "model": {"pretrained": {"checkpoint": str(checkpoint), "finetune": {
            "method": "lora", "rank": args.rank, "alpha": args.alpha, "dropout": args.dropout,
            "target_modules": args.targets.split(",")}}},
        "training": {"optimizer": {"name": "adamw", "lr": args.lr}, "loss": "bce",
                     "epochs": args.epochs, "batch_size": args.batch, "seed": 7,
                     "precision": args.precision, "num_threads": args.threads,
                     "checkpointing": {"enabled": False}},
        "compute": {"kind": "local", "device": args.device},
    }
    path = project / "spec.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def prepare(project: Path, spec_path: Path):
    """``dbspec run --only load_data,split,preprocess`` (untimed), and what the train stage
    reads of its outputs: spec, table, splits, fitted steps, and the raw texts."""
    import pandas as pd

    from dbspec.data import store
    from dbspec.spec.loader import load_spec

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "dbspec", "run", spec_path.name, "--only",
                           "load_data,split,preprocess"], cwd=project, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"dbspec could not prepare the data:\n{done.stdout}\n{done.stderr}")
    run_dir = project / ".dbspec" / "runs" / NAME
    stages = run_dir / "stages"
    state = json.loads((run_dir / "state.json").read_text())
    table = store.read_table(stages / "load_data", state["stages"]["load_data"]["output"],
                             stages / "preprocess")
    splits = store.read_splits(stages / "split")
    fitted = store.read_preprocessing(stages / "preprocess")
    texts = pd.read_parquet(stages / "load_data" / "raw.parquet")["text"].tolist()
    return load_spec(str(spec_path)).spec, table, splits, fitted, texts


def with_dbspec(prepared, device: torch.device) -> tuple[Result, Any]:
    """``fit_spec`` as the train stage calls it; only ``loop.train`` is timed."""
    import dbspec.training.loop as loop
    from dbspec.training.fit import fit_spec

    spec, table, splits, fitted, _ = prepared
    clock: dict[str, float] = {}
    original = loop.train

    def timed_train(*a, **k):
        _sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        outcome = original(*a, **k)
        _sync(device)
        clock["wall"], clock["cpu"] = time.perf_counter() - wall, time.process_time() - cpu
        return outcome

    loop.train = timed_train
    try:
        result = fit_spec(spec, table, splits, fitted)
    finally:
        loop.train = original
    samples = len(splits.train) * result.outcome.epochs_run
    served = result.served
    with torch.no_grad():
        x = served.transform(torch.from_numpy(table.features[splits.test]))
        logits = served.network(x).squeeze(1).float()
    y = torch.from_numpy(table.target[splits.test]).float()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y).item()
    accuracy = ((logits > 0).float() == y).float().mean().item()
    return Result(Speed(samples / clock["wall"], samples / clock["cpu"]), loss, accuracy), x


def encode(texts: list[str], checkpoint: Path, max_length: int) -> dict[str, torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return tokenizer(texts, padding="max_length", truncation=True, max_length=max_length,
                     return_tensors="pt")


def hand_written(encoded, labels: torch.Tensor, splits, checkpoint: Path, args,
                 device: torch.device) -> Result:
    """The fine-tuning as people write it with Transformers and peft."""
    import contextlib

    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(7)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    model = get_peft_model(model, LoraConfig(
        task_type=TaskType.SEQ_CLS, r=args.rank, lora_alpha=args.alpha,
        lora_dropout=args.dropout, target_modules=args.targets.split(","),
        modules_to_save=["pooler"])).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    ids, mask = encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
    y = labels.to(device)

    def part(rows):
        index = torch.from_numpy(rows).to(device)
        return ids[index], mask[index], y[index]

    train, val, test = part(splits.train), part(splits.validation), part(splits.test)
    autocast = contextlib.nullcontext if args.precision == "fp32" else (
        lambda: torch.autocast(device.type, dtype=torch.bfloat16 if args.precision == "bf16"
                               else torch.float16))
    generator = torch.Generator().manual_seed(7)
    n = len(splits.train)
    _sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.epochs):
        model.train()
        order = torch.randperm(n, generator=generator).to(device)
        for i in range(0, n, args.batch):
            batch = order[i:i + args.batch]
            with autocast():
                loss = model(input_ids=train[0][batch], attention_mask=train[1][batch],
                             labels=train[2][batch]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad(), autocast():
            model(input_ids=val[0], attention_mask=val[1], labels=val[2]).loss.item()
    _sync(device)
    speed = Speed(n * args.epochs / (time.perf_counter() - wall),
                  n * args.epochs / (time.process_time() - cpu))
    with torch.no_grad():
        out = model(input_ids=test[0], attention_mask=test[1], labels=test[2])
    accuracy = (out.logits.argmax(1) == test[2]).float().mean().item()
    return Result(speed, out.loss.item(), accuracy)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--generator", default="text_words",
                        help="the synthetic corpus (text_finetune.yaml's: text_words)")
    parser.add_argument("--targets", default="word_embeddings,query,value",
                        help="LoRA target modules, comma-separated (text_finetune.yaml's)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=48)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--results", action="store_true",
                        help="also write the figures into benchmarks/RESULTS.md")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--hidden", type=int, default=0,
                        help="fine-tune a random BERT this wide instead of tiny_bert")
    parser.add_argument("--layers", type=int, default=4, help="its layers (with --hidden)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecation notices
    device = torch.device(args.device)
    start_load = load()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        checkpoint = make_checkpoint(project / "bert", args.hidden, args.layers) \
            if args.hidden else TINY
        prepared = prepare(project, write_spec(project, args, checkpoint))
        _, table, splits, _, texts = prepared
        encoded = encode(texts, checkpoint, args.max_length)
        labels = torch.from_numpy(np.asarray(table.target)).long()
        peers: dict[str, Callable[[], Result]] = {
            "hand-written": lambda: hand_written(encoded, labels, splits, checkpoint, args,
                                                 device)}
        same_ids: list[bool] = []

        def dbspec_arm() -> Result:
            result, x = with_dbspec(prepared, device)
            same_ids.append(torch.equal(x.long(), encoded["input_ids"][splits.test]))
            torch.set_num_threads(args.threads)
            return result

        peers["dbspec"] = dbspec_arm
        results: dict[str, list[Result]] = {name: [] for name in peers}
        names = list(peers)
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                results[name].append(peers[name]())
    model = f"BERT hidden {args.hidden}, {args.layers} layers (random)" if args.hidden \
        else "specs/data/tiny_bert"
    print(f"{model}: {len(splits.train):,} training rows, max_length {args.max_length}, "
          f"batch {args.batch}, {args.epochs} epochs, LoRA r={args.rank} on {args.targets}, "
          f"{args.device} {args.precision}, {args.threads} thread(s), {args.repeats} repeats; "
          f"token ids identical: {all(same_ids)}")
    print("training samples/s (best of the repeats / median); test split of the last repeat:")
    for name, runs in results.items():
        walls, cpus = [r.speed.wall for r in runs], [r.speed.cpu for r in runs]
        last = runs[-1]
        print(f"  {name:<13} wall {max(walls):>9,.1f} / {statistics.median(walls):>9,.1f}   "
              f"per CPU-second {max(cpus):>9,.1f} / {statistics.median(cpus):>9,.1f}   "
              f"test loss {last.test_loss:.4f}  accuracy {last.test_accuracy:.4f}")
    base, ours = results["hand-written"], results["dbspec"]
    wall = (statistics.median(r.speed.wall for r in ours)
            / statistics.median(r.speed.wall for r in base))
    cpu = (statistics.median(r.speed.cpu for r in ours)
           / statistics.median(r.speed.cpu for r in base))
    if args.results:
        write_results(args, model, results, (wall, cpu), start_load)
    print(f"ratio dbspec / hand-written (medians): wall {wall:.3f}, per CPU-second {cpu:.3f} "
          "(target >= 0.95)")


def write_results(args, model: str, results: dict, ratios: tuple[float, float],
                  start_load: str) -> None:
    """This run's figures as finetune_vs_hf.py's section of benchmarks/RESULTS.md
    (tests/test_benchmark_results.py holds the goal in it)."""
    rows = []
    for name, runs in results.items():
        walls, cpus = [r.speed.wall for r in runs], [r.speed.cpu for r in runs]
        rows.append(f"| {name} | {statistics.median(walls):,.1f} | {statistics.median(cpus):,.1f}"
                    f" | {runs[-1].test_loss:.4f} / {runs[-1].test_accuracy:.3f} |")
    wall, cpu = ratios
    write_section("finetune_vs_hf.py", [
        "## Fine-tuning: dbspec's LoRA against the same fine-tuning written with Transformers"
        " and peft (issue 36)",
        "",
        conditions(f"finetune_vs_hf.py --repeats {args.repeats} --results", start_load)
        + f" {model}, {args.rows:,} rows of"
        f" `generator: {args.generator}`, LoRA r={args.rank} on {args.targets}, batch "
        f"{args.batch}, {args.epochs} epochs, {args.device} {args.precision}, {args.threads} "
        "thread(s); both arms interleaved, order rotating. Timed: the training loops only.",
        "",
        "| arm | training samples/s, median, wall | per CPU-second | test loss / accuracy |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        f"Ratio dbspec / hand-written, medians: **wall {wall:.3f}x**, per CPU-second "
        f"{cpu:.3f}x (goal >= 0.95).",
    ])


if __name__ == "__main__":
    main()
