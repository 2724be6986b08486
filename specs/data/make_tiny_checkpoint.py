"""Write specs/data/tiny_bert: a tiny BERT-like Transformers checkpoint for
specs/text_finetune.yaml, made here, so nothing is downloaded.

The checkpoint is committed; run this script only to rebuild it::

    python specs/data/make_tiny_checkpoint.py            # refuses when it exists
    python specs/data/make_tiny_checkpoint.py --force    # delete it and write it again
    python specs/data/make_tiny_checkpoint.py --out DIR  # somewhere else

What it holds (about 0.3 MB):

* ``tokenizer.json`` (and its Transformers config): a lowercasing WordPiece tokenizer
  (vocabulary 600) trained with the ``tokenizers`` package on the corpus of the spec's
  generated source (``generator: text``, seed 7), with BERT's special tokens and its
  ``[CLS] ... [SEP]`` template; ``[PAD]`` is id 0.
* ``config.json`` and ``model.safetensors``: a ``BertForMaskedLM`` (2 layers, hidden 32,
  2 heads, feed-forward 64, 64 positions) trained for a few hundred masked-language-model
  steps on that corpus (seed 0), enough that its layers carry something to fine-tune.

Needs ``transformers`` and ``torch`` (``pip install 'dbspec[train,finetune]'``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

OUT = Path(__file__).resolve().parent / "tiny_bert"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus(rows: int = 4000) -> list[str]:
    """The texts of specs/text_finetune.yaml's source (the same generator and seed)."""
    from dbspec.data.synthetic import generate_text

    source = SimpleNamespace(classes=2, seed=7, rows=rows, noise=0.0)
    return generate_text(source)["text"].tolist()


def train_tokenizer(texts: list[str]):
    """A BERT-style WordPiece tokenizer trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(texts, trainer=trainers.WordPieceTrainer(
        vocab_size=600, special_tokens=SPECIALS, show_progress=False))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tokenizer


def pretrain(model, tokenizer, texts: list[str], steps: int = 300) -> None:
    """A few masked-language-model steps (15% of the tokens masked)."""
    import torch

    fast = tokenizer
    batch_size, generator = 32, torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for step in range(steps):
        start = (step * batch_size) % (len(texts) - batch_size)
        batch = fast(texts[start:start + batch_size], padding=True, truncation=True,
                     max_length=48, return_tensors="pt")
        labels = batch["input_ids"].clone()
        chosen = (torch.rand(labels.shape, generator=generator) < 0.15) \
            & (batch["attention_mask"] == 1) & (labels > 4)
        labels[~chosen] = -100
        inputs = batch["input_ids"].masked_fill(chosen, tokenizer.mask_token_id)
        loss = model(input_ids=inputs, attention_mask=batch["attention_mask"],
                     labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def make(out: Path) -> None:
    import torch
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    texts = corpus()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(texts), unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]", model_max_length=64)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64, pad_token_id=0)
    model = BertForMaskedLM(config)
    pretrain(model, tokenizer, texts)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(argv: list[str], make=make, out: Path = OUT, doc: str = __doc__) -> int:
    """The command line of a checkpoint script: ``--out DIR`` (default ``out``), ``--force``;
    make_tiny_vit.py calls it with its own ``make``, ``out`` and docstring."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=out, help="directory to write")
    parser.add_argument("--force", action="store_true", help="replace an existing checkpoint")
    args = parser.parse_args(argv)
    if args.out.exists():
        if not args.force:
            print(f"{args.out} exists; --force rebuilds it", file=sys.stderr)
            return 1
        shutil.rmtree(args.out)
    make(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
