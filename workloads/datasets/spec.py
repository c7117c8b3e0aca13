"""The benchmark datasets as immutable facts: the four image datasets of Table 3.2 (docs/thesis.md),
and the token datasets of language models (`tokens`: synthetic, learnable; `text`: local text files,
byte-level).

Everything that needs to know a dataset's shape (the networks, the synthetic generator, the
batch-size table, `harness.describe`) reads it from here, so the table exists once. A token
dataset's sequence length and vocabulary are settings (`dataset.seq_len`,
`dataset.vocab_size`): `DatasetSpec.with_tokens` gives the spec a cell trains with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

IMAGE = "image"  # a sample is an image (C, H, W) and one class label
TOKENS = "tokens"  # a sample is seq_len token ids, the target the same ids shifted by one
KINDS = (IMAGE, TOKENS)


@dataclass(frozen=True)
class DatasetSpec:
    """Shape and size of one dataset.

    Attributes:
        name: config name (`dataset=<name>`).
        num_classes: number of label classes.
        num_images: images in the full dataset (Table 3.2); one epoch uses this many by default.
        num_eval_images: images in the held-out evaluation split: the real test splits (MNIST
            and CIFAR-10 test, 10,000 each; ImageNet val, 50,000); for Highres, which exists
            only as synthetic data, 10,000 (the size of the other small test splits, and 1/6 of
            its images as for CIFAR-10).
        channels: 1 for grayscale, 3 for RGB.
        resolution: height == width in pixels.
        synthetic_only: True when no real on-disk version exists (Highres).
        real_only: True when no synthetic version exists (`text`, read from local files).
        kind: "image" (classification: the loss is cross entropy on one label a sample) or
            "tokens" (language modelling: next-token cross entropy at every position).
        seq_len: tokens per sample (token datasets; 0 for images).
        vocab_size: distinct token ids (token datasets; 0 for images). A language model's
            output has one logit per token id, as an image network's has one per class.
    """

    name: str
    num_classes: int
    num_images: int
    num_eval_images: int
    channels: int
    resolution: int
    synthetic_only: bool = False
    real_only: bool = False
    kind: str = IMAGE
    seq_len: int = 0
    vocab_size: int = 0

    @property
    def tokens(self) -> bool:
        """True for a language-model dataset (token ids in, next-token targets out)."""
        return self.kind == TOKENS

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample: (C, H, W) for an image, (seq_len,) for a token sequence."""
        if self.tokens:
            return (self.seq_len,)
        return (self.channels, self.resolution, self.resolution)

    @property
    def input_dtype(self) -> torch.dtype:
        """Images in torch's default dtype (float32 unless the process set another: the
        trajectory tests train in float64), int64 token ids."""
        import torch  # a dataset's facts are read by commands that answer without torch

        return torch.int64 if self.tokens else torch.get_default_dtype()

    @property
    def target_shape(self) -> tuple[int, ...]:
        """Shape of one sample's target: () for a class label, (seq_len,) for next tokens."""
        return (self.seq_len,) if self.tokens else ()

    @property
    def tokens_per_sample(self) -> int:
        """Targets one sample contributes to the loss: seq_len for tokens, 1 for an image
        (tokens/s = samples/s x this)."""
        return self.seq_len if self.tokens else 1

    @property
    def output_classes(self) -> int:
        """Logits per prediction: the vocabulary for tokens, the classes for images."""
        return self.vocab_size if self.tokens else self.num_classes

    def example_batch(
        self, batch: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch of this dataset's shape: (inputs, targets), what a profiler or a
        shape check feeds a network (uniform images in [0, 1) or uniform token ids)."""
        import torch  # a dataset's facts are read by commands that answer without torch

        targets = torch.randint(
            0, self.output_classes, (batch, *self.target_shape), generator=generator
        )
        if self.tokens:
            return torch.randint(
                0, self.vocab_size, (batch, *self.input_shape), generator=generator
            ), targets
        return torch.rand((batch, *self.input_shape), generator=generator), targets

    def with_tokens(self, seq_len: int | None, vocab_size: int | None) -> DatasetSpec:
        """This spec with a cell's `dataset.seq_len` / `dataset.vocab_size` (None keeps the
        default); an image dataset is returned unchanged."""
        if not self.tokens:
            return self
        return dataclasses.replace(
            self,
            seq_len=seq_len or self.seq_len,
            vocab_size=vocab_size or self.vocab_size,
            num_classes=vocab_size or self.vocab_size,
        )

    @property
    def small_images(self) -> bool:
        """True for MNIST/CIFAR-size inputs, which use the small-image network variants."""
        return self.resolution <= 32

    @property
    def bytes_per_image(self) -> int:
        """Bytes of one image stored as uint8."""
        return self.channels * self.resolution * self.resolution


# The byte-level tokenizer of `text` has 256 token ids; a synthetic vocabulary defaults to the
# same, so the two token datasets train the same network shapes.
BYTE_VOCAB = 256
DEFAULT_SEQ_LEN = 128


DATASET_SPECS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "mnist",
            num_classes=10,
            num_images=70_000,
            num_eval_images=10_000,
            channels=1,
            resolution=28,
        ),
        DatasetSpec(
            "cifar10",
            num_classes=10,
            num_images=60_000,
            num_eval_images=10_000,
            channels=3,
            resolution=32,
        ),
        DatasetSpec(
            "imagenet",
            num_classes=1000,
            num_images=1_280_000,
            num_eval_images=50_000,
            channels=3,
            resolution=224,
        ),
        DatasetSpec(
            "highres",
            num_classes=1000,
            num_images=60_000,
            num_eval_images=10_000,
            channels=3,
            resolution=512,
            synthetic_only=True,
        ),
        # Language modelling. `tokens`: sequences of a seeded random Markov chain (learnable,
        # so next-token accuracy and time to quality mean something), 65,536 sequences (8.4 M
        # tokens at seq_len 128); `text`: a directory of local text files, byte-level tokens.
        # channels/resolution are 0: there is no image.
        DatasetSpec(
            "tokens",
            num_classes=BYTE_VOCAB,
            num_images=65_536,
            num_eval_images=4_096,
            channels=0,
            resolution=0,
            synthetic_only=True,
            kind=TOKENS,
            seq_len=DEFAULT_SEQ_LEN,
            vocab_size=BYTE_VOCAB,
        ),
        DatasetSpec(
            "text",
            num_classes=BYTE_VOCAB,
            num_images=65_536,
            num_eval_images=4_096,
            channels=0,
            resolution=0,
            real_only=True,
            kind=TOKENS,
            seq_len=DEFAULT_SEQ_LEN,
            vocab_size=BYTE_VOCAB,
        ),
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    """Return the spec of dataset `name`, or raise KeyError naming the allowed names."""
    try:
        return DATASET_SPECS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_SPECS)}") from None
