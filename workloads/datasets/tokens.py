"""Token datasets of language models: synthetic Markov-chain sequences, and local text files.

A sample is `(ids[:-1], ids[1:])`: seq_len int64 token ids in, the same ids shifted by one as the
next-token targets. Both datasets store their tokens once in the dataset cache (see `cache` for
the manifest, lock and atomic-write rules) and read them through a memory map, so loading costs
nothing and every rank and DataLoader worker shares the page cache; `TokenDataset.__getitems__`
returns a whole batch from one fancy-indexing read, as the synthetic images do.

`tokens` (synthetic). Uniform random ids could not be learned, so next-token accuracy and time to
quality would mean nothing; the sequences are instead walks of a seeded random first-order Markov
chain whose transitions are sparse and peaked. Every token has `len(PEAKS)` distinct successors,
drawn at random, taken with probabilities PEAKS = 0.6, 0.2, 0.1, 0.05; the remaining NOISE = 0.05
goes to a uniformly random token (any of the vocabulary, the successors included). So::

    P(next = k-th successor of v | v) = PEAKS[k] + NOISE / vocab_size
    P(next = any other token | v)     = NOISE / vocab_size

Every row of the transition table is a permutation of the same probabilities, so the best
possible next-token accuracy (the expected max transition probability, whatever the stationary
distribution) is exactly PEAKS[0] + NOISE / vocab_size: 0.6002 at the default vocabulary of 256,
against 1/256 = 0.0039 for guessing, and the best possible loss (the chain's entropy rate) is
1.429 nats against ln 256 = 5.545 (`best_next_token_accuracy`, `MarkovChain.entropy_rate`).
Nothing beyond the previous token helps, so a bigram model can already reach both: a bigram
logit table (nn.Embedding(256, 256)) trained with Adam (lr 0.1, batches of 16 x 64 tokens)
reaches an eval loss of 1.49 and an eval accuracy of 0.60 in 100 steps
(tests/unit/workloads/datasets/test_tokens.py); a 2-layer causal transformer (width 64, AdamW lr
3e-3, batches of 32 x 128) went from 5.75 to 1.69 in 50 steps and 1.50 in 300.

The chain depends on (seed, vocab_size) only; each split walks it with its own random stream, so
the eval split holds different sequences of the same chain (as the synthetic images' eval split
has its own noise over the same class templates). A walk starts at a uniformly random token. As
for images only `unique` distinct sequences are stored and index i reads sequence i % unique.
Sequences are generated in chunks of a fixed number of rows, each from its own stream, so
sequence i is the same whatever the number stored (a short run's data is a prefix of a long
one's).

`text` (real). Every `*.txt` file under `dataset.root` (recursive, sorted by relative path), its
bytes as they are on disk, joined by one SEPARATOR byte (NUL: a document boundary, as an
end-of-text token is, that text itself does not contain); each byte is a token (ids 0-255, a
fixed byte-level tokenizer, so vocab_size must be at least 256). The concatenation is written
once into the dataset cache, keyed by the files' paths, sizes and modification times (an edited
file gives a new entry); it is memory-mapped, never held in memory. The last 10 % of the bytes
(at least seq_len + 1) are the eval split, the rest the training split; sample i of a split is the
window `bytes[i * seq_len : i * seq_len + seq_len + 1]` (consecutive windows share one byte: the
last target of one is the first input of the next), as many as the split holds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from workloads.datasets.cache import ArraySpec, CacheEntry, load_or_generate
from workloads.datasets.spec import BYTE_VOCAB, DatasetSpec
from workloads.datasets.synthetic import SPLITS, unique_sample_count

logger = logging.getLogger(__name__)

# The chain (module docstring): the probabilities of a token's successors, most likely first, and
# the probability of a uniformly random next token instead.
PEAKS = (0.6, 0.2, 0.1, 0.05)
NOISE = 0.05
# Part of the cache keys: bump when the content changes for the same parameters.
GENERATOR_VERSION = 1
TEXT_FORMAT_VERSION = 1
# The random streams under (seed, dataset name, vocab_size): the chain, then per split its chunks.
_CHAIN_STREAM = 0
# Tokens walked per chunk (about 24 MB of temporaries): bounded memory, and wide enough that the
# per-step numpy calls of the walk stay cheap.
_CHUNK_TOKENS = 1 << 20
TOKENS_FILE = "tokens.npy"
TEXT_FILE = "text.npy"
SEPARATOR = 0
# Share of the text's bytes held out for evaluation.
EVAL_FRACTION = 0.1


def best_next_token_accuracy(vocab_size: int) -> float:
    """The best possible next-token accuracy on synthetic tokens: the most likely successor's
    probability, the same in every row of the chain (module docstring)."""
    return _successor_probabilities(vocab_size)[0] + NOISE / vocab_size


def _successor_probabilities(vocab_size: int) -> tuple[float, ...]:
    """PEAKS, or for a vocabulary smaller than PEAKS its first vocab_size entries rescaled to
    the same total (the successors of a token are distinct)."""
    peaks = PEAKS[:vocab_size]
    scale = sum(PEAKS) / sum(peaks)
    return tuple(peak * scale for peak in peaks)


@dataclass(frozen=True)
class MarkovChain:
    """A sparse, peaked first-order Markov chain over `vocab_size` token ids.

    Attributes:
        successors: int64 (vocab_size, width): each token's distinct likely successors, most
            likely first.
        probabilities: the probability of each successor column before the uniform noise.
    """

    successors: np.ndarray
    probabilities: tuple[float, ...]

    @property
    def vocab_size(self) -> int:
        return len(self.successors)

    @property
    def best_accuracy(self) -> float:
        """The expected max transition probability: the best possible next-token accuracy."""
        return self.probabilities[0] + NOISE / self.vocab_size

    @property
    def entropy_rate(self) -> float:
        """The best possible mean next-token loss (nats): the entropy of every row."""
        floor = NOISE / self.vocab_size
        peaked = [p + floor for p in self.probabilities]
        rest = self.vocab_size - len(peaked)
        return -sum(p * math.log(p) for p in peaked) - (
            rest * floor * math.log(floor) if rest else 0.0
        )

    def walk(self, rng: np.random.Generator, rows: int, length: int) -> np.ndarray:
        """`rows` walks of `length` tokens, int64 (rows, length), from uniformly random starts.

        The draws are made up front as (length, rows) arrays, so each step of the loop over
        time is a few contiguous vectorised operations over all the walks.
        """
        width = len(self.probabilities)
        thresholds = np.cumsum(self.probabilities)
        choice = np.searchsorted(thresholds, rng.random((length, rows)), side="right")
        uniform = rng.integers(0, self.vocab_size, size=(length, rows), dtype=np.int64)
        ids = np.empty((length, rows), dtype=np.int64)
        ids[0] = uniform[0]
        for step in range(1, length):
            column = choice[step]
            follow = self.successors[ids[step - 1], np.minimum(column, width - 1)]
            ids[step] = np.where(column < width, follow, uniform[step])
        return ids.T


def markov_chain(seed: int, vocab_size: int) -> MarkovChain:
    """The chain of (seed, vocab_size): the same for every split and sequence length."""
    rng = _rng(seed, vocab_size, _CHAIN_STREAM)
    probabilities = _successor_probabilities(vocab_size)
    return MarkovChain(_distinct_successors(rng, vocab_size, len(probabilities)), probabilities)


def _distinct_successors(rng: np.random.Generator, vocab_size: int, width: int) -> np.ndarray:
    """(vocab_size, width) random ids, distinct within each row: rows with a repeat are redrawn
    (few are, unless the vocabulary is tiny), which scales to vocabularies where a per-row
    permutation of the whole vocabulary would not."""
    table = rng.integers(0, vocab_size, size=(vocab_size, width), dtype=np.int64)
    while True:
        ordered = np.sort(table, axis=1)
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
        if not repeated.any():
            return table
        table[repeated] = rng.integers(
            0, vocab_size, size=(int(repeated.sum()), width), dtype=np.int64
        )


def _rng(seed: int, vocab_size: int, *stream: int) -> np.random.Generator:
    """An independent stream for (seed, vocab_size, stream ids); crc32 of the name because
    Python's str hash changes between processes."""
    name_code = zlib.crc32(b"tokens")
    return np.random.default_rng(
        np.random.SeedSequence([seed, name_code, vocab_size], spawn_key=stream)
    )


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 storage while the ids fit (a quarter of int64), else int32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


@dataclass(frozen=True)
class TokenWindows:
    """Where a split's samples lie in a cached token file: sample row r is the seq_len + 1
    tokens starting at flat position `start + r * stride` (stride seq_len + 1 for stored
    sequences, seq_len for the overlapping windows of a text)."""

    path: Path
    seq_len: int
    stride: int
    start: int
    rows: int

    def view(self) -> np.ndarray:
        """A read-only (rows, seq_len + 1) view of the memory-mapped file (no copy)."""
        flat = np.load(self.path, mmap_mode="r").reshape(-1)
        end = self.start + (self.rows - 1) * self.stride + self.seq_len + 1
        if end > flat.size:
            raise ValueError(
                f"{self.path} holds {flat.size} tokens, its windows need {end}; "
                f"delete the cache entry {self.path.parent} to regenerate it"
            )
        window = flat[self.start : end]
        return np.lib.stride_tricks.as_strided(
            window,
            shape=(self.rows, self.seq_len + 1),
            strides=(self.stride * window.itemsize, window.itemsize),
            writeable=False,
        )


class TokenDataset(Dataset):
    """`length` token samples over the `rows` windows of a cached file: sample i is row
    `selection[i]` when a selection is given, else row i % rows.

    A sample is (inputs, targets), int64 (seq_len,) each; `__getitems__` returns a batch,
    int64 (N, seq_len) each, from one read.
    """

    # Tells `EpochLoader` that `__getitems__` returns a ready (inputs, targets) batch.
    fetches_whole_batches = True

    def __init__(
        self,
        windows: TokenWindows,
        length: int,
        *,
        selection: np.ndarray | None = None,
        generated: bool = False,
    ) -> None:
        self.windows = windows
        self.length = length
        self.selection = selection
        self.generated = generated  # whether building this dataset (re)generated the cache
        self._view: np.ndarray | None = None

    def __len__(self) -> int:
        return self.length

    @property
    def seq_len(self) -> int:
        return self.windows.seq_len

    @property
    def unique_samples(self) -> int:
        """Distinct windows behind the samples."""
        return self.windows.rows

    def select(self, indices: Iterable[int]) -> TokenDataset:
        """The samples at `indices` (rows of this dataset), still read a batch at a time (a
        torch Subset would hide `__getitems__` behind per-sample reads)."""
        rows = self._rows(np.fromiter(indices, dtype=np.int64))
        return TokenDataset(self.windows, len(rows), selection=rows, generated=self.generated)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of `indices`: int64 (N, seq_len) inputs and the targets shifted by one."""
        tokens = self._array()[self._rows(np.asarray(indices, dtype=np.int64))]
        return (
            torch.from_numpy(tokens[:, :-1].astype(np.int64)),
            torch.from_numpy(tokens[:, 1:].astype(np.int64)),
        )

    def _rows(self, positions: np.ndarray) -> np.ndarray:
        """The window rows of sample `positions`, which must lie in [0, length)."""
        if positions.size and (positions.min() < 0 or positions.max() >= self.length):
            raise IndexError(f"indices outside [0, {self.length})")
        if self.selection is not None:
            return self.selection[positions]
        return positions % self.windows.rows

    def _array(self) -> np.ndarray:
        """The windows, mapped lazily so that worker processes map the file themselves."""
        if self._view is None:
            self._view = self.windows.view()
        return self._view

    def __getstate__(self) -> dict[str, Any]:
        # Pickling the view would copy the whole file into each DataLoader worker's message.
        return {**self.__dict__, "_view": None}


# ------------------------------------------------------------------------- synthetic tokens


def build_synthetic_tokens(
    spec: DatasetSpec,
    *,
    length: int,
    seed: int,
    cache_dir: str | Path,
    unique_samples: int | None = None,
    verify: bool = True,
    split: str = "train",
) -> TokenDataset:
    """`length` walks of the chain of (seed, spec.vocab_size), generated into `cache_dir` if
    needed (the synthetic images' `build_synthetic`, for tokens).

    Args:
        spec: a token dataset; its seq_len and vocab_size shape the sequences.
        length: samples in the dataset (one epoch, or the evaluated samples).
        seed: non-negative; it and the vocabulary determine the chain, and with the split and
            seq_len every stored token.
        cache_dir: parent directory of the cache entries.
        unique_samples: distinct sequences stored (default: spec.num_images, at most `length`).
        verify: re-check the sha256 of cached files, not only their sizes.
        split: "train" or "eval": the same chain, walked by the split's own random stream.
    """
    _check_synthetic(spec, length, seed, split)
    unique = unique_sample_count(spec, length, unique_samples)
    tokens_per_row = spec.seq_len + 1
    directory = Path(cache_dir) / (
        f"{spec.name}-L{spec.seq_len}-V{spec.vocab_size}-u{unique}"
        f"-seed{seed}-{split}-v{GENERATOR_VERSION}"
    )
    params = {
        "dataset": spec.name,
        "split": split,
        "seq_len": spec.seq_len,
        "vocab_size": spec.vocab_size,
        "unique_samples": unique,
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
    }
    specs = {TOKENS_FILE: ArraySpec((unique, tokens_per_row), token_dtype(spec.vocab_size))}

    def make_chunks(_: str) -> Iterator[np.ndarray]:
        return _token_chunks(
            markov_chain(seed, spec.vocab_size), unique, tokens_per_row, seed, split
        )

    entry = load_or_generate(directory, params, specs, make_chunks, verify=verify)
    if entry.generated:
        logger.info(
            "generated synthetic %s (%s split): %d sequences of %d tokens in %s",
            spec.name,
            split,
            unique,
            tokens_per_row,
            directory,
        )
    windows = TokenWindows(
        directory / TOKENS_FILE, spec.seq_len, stride=tokens_per_row, start=0, rows=unique
    )
    return TokenDataset(windows, length, generated=entry.generated)


def _check_synthetic(spec: DatasetSpec, length: int, seed: int, split: str) -> None:
    """Reject what cannot be generated, in one line naming the setting."""
    if not spec.tokens:
        raise ValueError(
            f"dataset {spec.name!r} is not a token dataset; synthetic tokens need dataset=tokens"
        )
    if spec.real_only:
        raise ValueError(
            f"dataset {spec.name!r} is read from local files (dataset.root); "
            f"allowed source: real, or dataset=tokens for synthetic tokens"
        )
    if seed < 0:
        raise ValueError(f"seed must be non-negative for synthetic data, got {seed}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    if length < 1 or spec.seq_len < 1 or spec.vocab_size < 1:
        raise ValueError(
            f"synthetic tokens need positive num_samples, dataset.seq_len and "
            f"dataset.vocab_size, got {length}, {spec.seq_len}, {spec.vocab_size}"
        )


def _token_chunks(
    chain: MarkovChain, unique: int, tokens_per_row: int, seed: int, split: str
) -> Iterator[np.ndarray]:
    """The stored sequences, a chunk of rows at a time. Every chunk walks its full row count
    from its own stream and the last one is cut, so a row's content does not depend on
    `unique`."""
    per_chunk = max(1, _CHUNK_TOKENS // tokens_per_row)
    dtype = token_dtype(chain.vocab_size)
    for index, start in enumerate(range(0, unique, per_chunk)):
        rng = _rng(seed, chain.vocab_size, 1 + SPLITS.index(split), index)
        yield chain.walk(rng, per_chunk, tokens_per_row)[: unique - start].astype(dtype)


# ------------------------------------------------------------------------------- text files


def build_text(
    spec: DatasetSpec, root: str | Path, split: str, *, cache_dir: str | Path, verify: bool = True
) -> TokenDataset:
    """One split of the byte-level text under `root` (module docstring), its concatenation
    cached in `cache_dir`.

    Raises:
        ValueError: the vocabulary is below 256, `root` is not a directory, holds no .txt file,
            or too few bytes for one training and one eval window of spec.seq_len.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    directory, files, total = check_text_root(spec, root)
    seq_len = spec.seq_len
    entry = _cached_concatenation(directory, files, total, cache_dir, verify=verify)
    eval_bytes = max(math.ceil(total * EVAL_FRACTION), seq_len + 1)
    start, size = (0, total - eval_bytes) if split == "train" else (total - eval_bytes, eval_bytes)
    windows = TokenWindows(
        entry.directory / TEXT_FILE,
        seq_len,
        stride=seq_len,
        start=start,
        rows=(size - 1) // seq_len,
    )
    return TokenDataset(windows, windows.rows, generated=entry.generated)


FileListing = list[tuple[str, int, int]]  # (path relative to root, size, mtime_ns) per file


def check_text_root(spec: DatasetSpec, root: str | Path) -> tuple[Path, FileListing, int]:
    """The directory, its .txt files and the bytes they join to; ValueError (one line naming
    the setting) if the vocabulary is below 256, `root` is not a directory, holds no .txt file,
    or too few bytes for one training and one eval window of spec.seq_len. Cheap (it lists
    and stats the files): commands run it before anything starts."""
    if spec.vocab_size < BYTE_VOCAB:
        raise ValueError(
            f"dataset.vocab_size={spec.vocab_size} is below the {BYTE_VOCAB} ids "
            f"of the byte-level tokenizer of dataset={spec.name}; allowed: "
            f"{BYTE_VOCAB} or more"
        )
    directory = Path(root).expanduser().resolve()
    files = _text_files(directory, root)
    total = sum(size for _, size, _ in files) + len(files) - 1
    needed = 2 * (spec.seq_len + 1)
    if total < needed:
        raise ValueError(
            f"dataset.root={root} holds {total} bytes of text in {len(files)} .txt "
            f"file(s); dataset.seq_len={spec.seq_len} needs at least {needed} (one "
            f"training and one eval sample): add text or lower dataset.seq_len"
        )
    return directory, files, total


def _text_files(directory: Path, root: str | Path) -> FileListing:
    """Every .txt file under `directory`, sorted by relative path, with its size and mtime."""
    if not directory.is_dir():
        raise ValueError(
            f"dataset.root={root} is not an existing directory; set it to the "
            f"directory holding the .txt files"
        )
    paths = sorted(
        (path for path in _walk(directory) if path.suffix == ".txt" and path.is_file()),
        key=lambda path: path.relative_to(directory).as_posix(),
    )
    if not paths:
        raise ValueError(
            f"dataset.root={root} holds no .txt file (searched recursively); "
            f"put the text there as UTF-8 .txt files"
        )
    listing = []
    for path in paths:
        stat = path.stat()
        listing.append((path.relative_to(directory).as_posix(), stat.st_size, stat.st_mtime_ns))
    return listing


def _walk(directory: Path) -> Iterator[Path]:
    """Every entry under `directory`, at any depth, by a loop over a stack of directories
    (Python 3.11's `rglob` and `os.walk` recurse, and a tree a thousand levels deep ended in
    RecursionError); a symbolic link to a directory is not followed (a link to a parent would
    never end), a link to a file is listed, a directory that cannot be listed is passed over
    (as `rglob` did)."""
    pending = [directory]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except PermissionError:  # a directory this user cannot list holds no text it can read
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
            else:
                yield Path(entry.path)


def _cached_concatenation(
    directory: Path, files: FileListing, total: int, cache_dir: str | Path, *, verify: bool
) -> CacheEntry:
    """The cache entry holding the files' bytes joined by SEPARATOR, written if not there yet.

    The entry's name is a digest of the listing (paths, sizes, mtimes), so an edited, added or
    removed file gives a new entry rather than stale text.
    """
    params = {
        "dataset": "text",
        "root": str(directory),
        "separator": SEPARATOR,
        "files": [list(file) for file in files],
        "format_version": TEXT_FORMAT_VERSION,
    }
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    entry_dir = Path(cache_dir) / f"text-{digest}"

    def make_chunks(_: str) -> Iterator[np.ndarray]:
        return _file_chunks(directory, files)

    entry = load_or_generate(
        entry_dir,
        params,
        {TEXT_FILE: ArraySpec((total,), np.dtype(np.uint8))},
        make_chunks,
        verify=verify,
    )
    if entry.generated:
        logger.info(
            "cached %d bytes of text from %d files under %s in %s",
            total,
            len(files),
            directory,
            entry_dir,
        )
    return entry


def _file_chunks(directory: Path, files: FileListing) -> Iterator[np.ndarray]:
    """Each file's bytes, a SEPARATOR between two files; a file whose size changed since it
    was listed is refused (the cache key would not describe what is stored)."""
    separator = np.array([SEPARATOR], dtype=np.uint8)
    for number, (name, size, _) in enumerate(files):
        data = np.fromfile(directory / name, dtype=np.uint8)
        if data.size != size:
            raise ValueError(
                f"dataset.root={directory}: {name} changed while it was read; "
                f"run again once the text is no longer being written"
            )
        if number:
            yield separator
        yield data
