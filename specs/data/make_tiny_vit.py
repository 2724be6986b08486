"""Write specs/data/tiny_vit: a tiny ViT image classifier checkpoint for fine-tuning tests on
specs/data/digits_png, made here, so nothing is downloaded.

The checkpoint is committed; run this script only to rebuild it::

    python specs/data/make_tiny_vit.py            # refuses when it exists
    python specs/data/make_tiny_vit.py --force    # delete it and write it again

What it holds (about 0.1 MB):

* ``preprocessor_config.json``: a ``ViTImageProcessor`` for 8 x 8 grayscale images, pixels
  rescaled to [0, 1] and normalised with mean 0.5, deviation 0.5.
* ``config.json`` and ``model.safetensors``: a ``ViTForImageClassification`` (8 x 8 pixels,
  one channel, 2 x 2 patches, 2 layers, hidden 32, 2 heads) trained for a few hundred steps
  (seed 0) to tell odd digits from even ones: a two-label head that a ten-digit task replaces
  (``new_head: true``), over layers that have seen digits.

Needs ``transformers``, ``torch`` and ``scikit-learn``.
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "tiny_vit"


def make(out: Path, steps: int = 300) -> None:
    import torch
    from sklearn.datasets import load_digits
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    digits = load_digits()
    pixels = torch.tensor(digits.images, dtype=torch.float32).round_().mul_(255 / 16)
    x = ((pixels / 255 - 0.5) / 0.5).unsqueeze(1)
    y = torch.tensor(digits.target % 2)
    torch.manual_seed(0)
    config = ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32,
                       num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       num_labels=2, id2label={0: "even", 1: "odd"},
                       label2id={"even": 0, "odd": 1})
    model = ViTForImageClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for step in range(steps):
        batch = torch.randint(0, len(y), (64,))
        loss = model(pixel_values=x[batch], labels=y[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out)
    ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5],
                      do_rescale=True, rescale_factor=1 / 255).save_pretrained(out)




if __name__ == "__main__":
    from make_tiny_checkpoint import main  # the same --out / --force command line

    sys.exit(main(sys.argv[1:], make, OUT, __doc__))
