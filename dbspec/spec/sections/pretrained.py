"""``model.pretrained``: start from a Hugging Face Transformers checkpoint and fine-tune it.

The checkpoint's sequence-classification model (its own head, or a new one sized for the task)
reads the ids of the checkpoint's own tokenizer (a text feature with ``tokenizer: checkpoint``);
a vision checkpoint's image-classification model reads an image feature's pixels.
"""

from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from dbspec.spec.sections.base import SpecModel, d, section, shorthand


class FullFinetune(SpecModel):
    """Every weight that ``freeze`` leaves trainable is trained."""

    method: Literal["full"] = d("Fine-tuning method: train the weights themselves.")


class LoraFinetune(SpecModel):
    """Low-rank adapters (LoRA, through peft) on the named modules; the checkpoint's weights
    stay fixed, the classification head and whatever else the checkpoint lacks (the pooler of
    a masked-LM checkpoint) are trained in full. The logged model has the adapters merged into
    the weights: it loads and serves as a plain Transformers model, without peft."""

    method: Literal["lora"] = d("Fine-tuning method: LoRA adapters.")
    rank: int = d("Rank r of each adapter.", default=8, ge=1, le=4096)
    alpha: float = d("Scaling numerator: adapters are scaled by alpha / rank.", default=16.0,
                     gt=0)
    dropout: float = d("Dropout on the adapters' input.", default=0.0, ge=0, lt=1)
    target_modules: list[Annotated[str, Field(min_length=1)]] = d(
        "Names of the linear (or embedding) modules that get adapters: the last part of a "
        "module's name (query, value for BERT; q_proj, v_proj for most decoders); validate checks that the "
        "checkpoint has them.", default=["query", "value"], min_length=1)


_Finetunes = Union[FullFinetune, LoraFinetune]
FinetuneSpec = Annotated[_Finetunes, Field(discriminator="method"),
                         shorthand(_Finetunes, "method", Literal["full", "lora"])]


class PretrainedSpec(SpecModel):
    """A pretrained Transformers checkpoint fine-tuned for the task: text classification or
    regression through its sequence-classification model, or image classification through a
    vision checkpoint's image-classification model. Nothing is downloaded unless the
    checkpoint is a hub id and the hub is reachable."""

    checkpoint: str = d(
        "Where the checkpoint is: a local directory or a Unity Catalog Volume path "
        "(/Volumes/catalog/schema/volume/dir) holding config.json, the weights "
        "(model.safetensors) and the tokenizer (tokenizer.json) or image processor "
        "(preprocessor_config.json), or a hub id (org/name), "
        "fetched when the run starts where the hub is reachable.", min_length=1)
    revision: Optional[str] = d("Hub revision (branch, tag or commit) of a hub id.",
                                default=None, min_length=1)
    finetune: FinetuneSpec = section("Fine-tuning method: full, or lora with its settings.",
                                     method="full")
    freeze: list[Annotated[str, Field(min_length=1)]] = d(
        "Parameter-name prefixes kept fixed (full fine-tuning), such as 'bert.embeddings' or "
        "'bert.encoder.layer.0'; validate checks them against the checkpoint.", default=[])
    new_head: bool = d(
        "Replace a classification head the checkpoint already has (its label count differs "
        "from the task's) with a new one; a checkpoint without a head always gets a new one.",
        default=False)
    gradient_checkpointing: bool = d(
        "Recompute activations in the backward pass instead of keeping them: less memory, "
        "about a third more compute.", default=False)

    def summary(self) -> str:
        """The model in a few words, for ``dbspec plan``."""
        tune = self.finetune
        how = (f"LoRA (rank {tune.rank}, alpha {tune.alpha:g}) on "
               f"{', '.join(tune.target_modules)}" if isinstance(tune, LoraFinetune)
               else "full fine-tuning")
        frozen = f", frozen: {', '.join(self.freeze)}" if self.freeze else ""
        return f"pretrained {self.checkpoint}, {how}{frozen}"
