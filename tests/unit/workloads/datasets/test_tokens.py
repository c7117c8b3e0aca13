"""Token datasets: synthetic Markov-chain sequences (learnable, cached) and byte-level text."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, DatasetConfig
from workloads.datasets import (
    EpochLoader,
    TokenDataset,
    best_next_token_accuracy,
    build_dataset,
    dataset_spec,
    markov_chain,
)
from workloads.datasets.cache import MANIFEST_NAME
from workloads.datasets.loader import fetch_batch
from workloads.datasets.tokens import NOISE, PEAKS, SEPARATOR, TEXT_FILE, TOKENS_FILE

TOKENS = dataset_spec("tokens")
TEXT = dataset_spec("text")


def synthetic(
    cache: Path,
    *,
    seq_len: int = 32,
    vocab: int = 64,
    num_samples: int = 16,
    seed: int = 0,
    split: str = "train",
) -> TokenDataset:
    dataset = build_dataset(
        TOKENS.with_tokens(seq_len, vocab),
        split=split,
        num_samples=num_samples,
        seed=seed,
        cache_dir=cache,
    )
    assert isinstance(dataset, TokenDataset)
    return dataset


def stored(dataset: TokenDataset) -> np.ndarray:
    return np.load(dataset.windows.path)


def write_text(root: Path, files: dict[str, bytes]) -> bytes:
    """Write `files` under `root`; return their expected concatenation (sorted by path)."""
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    texts = [files[name] for name in sorted(files) if name.endswith(".txt")]
    return bytes([SEPARATOR]).join(texts)


def text(
    root: Path,
    cache: Path,
    *,
    seq_len: int = 8,
    split: str = "train",
    num_samples: int | None = None,
) -> TokenDataset:
    dataset = build_dataset(
        TEXT.with_tokens(seq_len, None),
        split=split,
        source="real",
        root=root,
        cache_dir=cache,
        num_samples=num_samples,
    )
    assert isinstance(dataset, TokenDataset)
    return dataset


# --------------------------------------------------------------------------- synthetic tokens


def test_synthetic_samples_are_int64_sequences_shifted_by_one(tmp_path: Path) -> None:
    dataset = synthetic(tmp_path, seq_len=32, vocab=64, num_samples=16)
    inputs, targets = dataset.__getitems__([0, 5, 15])
    assert inputs.shape == targets.shape == (3, 32)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert 0 <= int(inputs.min()) and int(targets.max()) < 64
    single_inputs, single_targets = dataset[5]
    assert single_inputs.shape == single_targets.shape == (32,)
    assert torch.equal(single_inputs, inputs[1]) and torch.equal(single_targets, targets[1])
    assert stored(dataset).dtype == np.uint16 and stored(dataset).shape == (16, 33)
    with pytest.raises(IndexError):
        dataset.__getitems__([16])


def test_large_vocabularies_are_stored_as_int32(tmp_path: Path) -> None:
    dataset = synthetic(tmp_path, seq_len=4, vocab=70_000, num_samples=4)
    assert stored(dataset).dtype == np.int32
    assert int(dataset.__getitems__([0, 1, 2, 3])[1].max()) < 70_000


def test_synthetic_tokens_are_determined_by_the_seed(tmp_path: Path) -> None:
    first = stored(synthetic(tmp_path / "a", seed=3))
    assert np.array_equal(first, stored(synthetic(tmp_path / "b", seed=3)))
    assert not np.array_equal(first, stored(synthetic(tmp_path / "c", seed=4)))
    # A sequence does not depend on how many are stored: a short run's data is a prefix.
    longer = stored(synthetic(tmp_path / "d", seed=3, num_samples=64))
    assert np.array_equal(longer[:16], first)


def test_unique_samples_repeat(tmp_path: Path) -> None:
    dataset = build_dataset(
        TOKENS.with_tokens(16, 32), num_samples=40, cache_dir=tmp_path, synthetic_unique_samples=8
    )
    assert isinstance(dataset, TokenDataset) and dataset.unique_samples == 8
    assert len(dataset) == 40
    inputs, _ = dataset.__getitems__([3, 11, 35])
    assert torch.equal(inputs[0], inputs[1]) and torch.equal(inputs[0], inputs[2])


def transitions(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return rows[:, :-1].ravel().astype(np.int64), rows[:, 1:].ravel().astype(np.int64)


def successor_share(rows: np.ndarray, successors: np.ndarray) -> float:
    """Share of the transitions that go to one of the chain's likely successors."""
    previous, following = transitions(rows)
    return float((successors[previous] == following[:, None]).any(axis=1).mean())


def test_splits_differ_but_walk_the_same_chain(tmp_path: Path) -> None:
    vocab = 64
    train = stored(synthetic(tmp_path, vocab=vocab, num_samples=256))
    held_out = stored(synthetic(tmp_path, vocab=vocab, num_samples=256, split="eval"))
    assert not np.array_equal(train, held_out)
    chain = markov_chain(0, vocab)
    expected = sum(PEAKS) + NOISE * len(PEAKS) / vocab  # 0.953
    for rows in (train, held_out):
        assert successor_share(rows, chain.successors) == pytest.approx(expected, abs=0.01)
    # Another seed's chain does not explain the data (about 4 / vocab of it, plus noise).
    assert successor_share(train, markov_chain(1, vocab).successors) < 0.2


def test_the_data_has_the_documented_best_accuracy(tmp_path: Path) -> None:
    vocab = 256
    best = best_next_token_accuracy(vocab)
    assert best == pytest.approx(0.6 + 0.05 / 256) == markov_chain(0, vocab).best_accuracy
    assert markov_chain(0, vocab).entropy_rate == pytest.approx(1.4295, abs=1e-4)
    previous, following = transitions(
        stored(synthetic(tmp_path, seq_len=128, vocab=vocab, num_samples=2048))
    )
    counts = np.zeros((vocab, vocab), dtype=np.int64)
    np.add.at(counts, (previous, following), 1)
    empirical_max = counts.max(axis=1).sum() / counts.sum()
    top = markov_chain(0, vocab).successors[:, 0]
    assert empirical_max == pytest.approx(best, abs=0.01)
    assert float((top[previous] == following).mean()) == pytest.approx(best, abs=0.01)


def test_a_bigram_model_learns_the_synthetic_tokens(tmp_path: Path) -> None:
    vocab = 256
    train = synthetic(tmp_path, seq_len=64, vocab=vocab, num_samples=1600)
    torch.manual_seed(0)
    model = torch.nn.Embedding(vocab, vocab)  # row v: the logits of the token after v
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    loader = EpochLoader(train, 16, seed=0)
    for inputs, targets in loader:  # 100 steps
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, -2), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    inputs, targets = synthetic(
        tmp_path, seq_len=64, vocab=vocab, num_samples=256, split="eval"
    ).__getitems__(list(range(256)))
    with torch.no_grad():
        logits = model(inputs)
    eval_loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten())
    accuracy = float((logits.argmax(-1) == targets).float().mean())
    assert len(loader) == 100
    assert float(eval_loss) < 0.4 * math.log(vocab)  # 2.2 nats; chance is 5.5, the best 1.43
    assert accuracy > 0.5  # the best possible is 0.6002, chance 0.004


def test_synthetic_tokens_refuse_the_real_source_and_text_the_synthetic(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only as synthetic"):
        build_dataset(TOKENS, source="real", root=tmp_path, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="dataset.root"):
        build_dataset(TEXT, source="synthetic", cache_dir=tmp_path)


# --------------------------------------------------------------------------------- text files

FILES = {
    "b.txt": "héllo, wörld\n".encode() * 9,
    "a/z.txt": b"The quick brown fox jumps over the lazy dog.\n" * 4,
    "a/notes.md": b"not text: ignored",
    "c.txt": b"",
}


def test_text_windows_cover_the_concatenated_bytes(tmp_path: Path) -> None:
    corpus = write_text(tmp_path / "root", FILES)
    assert corpus.startswith(b"The quick") and b"ignored" not in corpus
    train = text(tmp_path / "root", tmp_path / "cache", seq_len=8)
    held_out = text(tmp_path / "root", tmp_path / "cache", seq_len=8, split="eval")
    eval_bytes = max(math.ceil(len(corpus) / 10), 9)
    train_bytes = len(corpus) - eval_bytes
    assert len(train) == (train_bytes - 1) // 8 and len(held_out) == (eval_bytes - 1) // 8
    data = np.frombuffer(corpus, dtype=np.uint8).astype(np.int64)
    inputs, targets = train.__getitems__(list(range(len(train))))
    for index in range(len(train)):
        window = data[index * 8 : index * 8 + 9]
        assert inputs[index].tolist() == window[:-1].tolist()
        assert targets[index].tolist() == window[1:].tolist()
    assert index * 8 + 9 <= train_bytes  # training never reads the eval bytes
    eval_inputs, eval_targets = held_out.__getitems__([0])
    assert eval_inputs[0].tolist() == data[train_bytes : train_bytes + 8].tolist()
    assert eval_targets[0].tolist() == data[train_bytes + 1 : train_bytes + 9].tolist()
    assert inputs.dtype == torch.int64


def test_text_num_samples_first_for_training_evenly_spaced_for_eval(tmp_path: Path) -> None:
    write_text(tmp_path / "root", FILES)
    whole = text(tmp_path / "root", tmp_path / "cache", seq_len=4)
    first = text(tmp_path / "root", tmp_path / "cache", seq_len=4, num_samples=5)
    assert isinstance(first, TokenDataset) and len(first) == 5
    assert torch.equal(first.__getitems__(list(range(5)))[0], whole.__getitems__(list(range(5)))[0])
    held_out = text(tmp_path / "root", tmp_path / "cache", seq_len=4, split="eval")
    spaced = text(tmp_path / "root", tmp_path / "cache", seq_len=4, split="eval", num_samples=3)
    size = len(held_out)
    picks = [index * size // 3 for index in range(3)]
    assert torch.equal(spaced.__getitems__([0, 1, 2])[1], held_out.__getitems__(picks)[1])
    with pytest.raises(ValueError, match=f"exceeds the {len(whole)} samples"):
        text(tmp_path / "root", tmp_path / "cache", seq_len=4, num_samples=len(whole) + 1)


def test_bad_text_roots_are_refused_naming_dataset_root(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="dataset.root=.* is not an existing directory"):
        text(tmp_path / "missing", cache)
    write_text(tmp_path / "no_text", {"a.md": b"markdown only"})
    with pytest.raises(ValueError, match="dataset.root=.* holds no .txt file"):
        text(tmp_path / "no_text", cache)
    write_text(tmp_path / "short", {"a.txt": b"x" * 17})
    with pytest.raises(ValueError, match=r"holds 17 bytes .*seq_len=8 needs at least 18"):
        text(tmp_path / "short", cache, seq_len=8)
    assert len(text(tmp_path / "short", cache, seq_len=7)) == 1  # 16 bytes: one window each
    with pytest.raises(ValueError, match="dataset.vocab_size=100"):
        build_dataset(
            TEXT.with_tokens(8, 100), source="real", root=tmp_path / "short", cache_dir=cache
        )


def test_text_at_any_depth_is_found_and_a_link_to_a_parent_is_not_followed(
    tmp_path: Path,
) -> None:
    """1,100 nested directories (Python's own recursive listings end in RecursionError there)
    and a symbolic link back to the root (a listing that followed it would never end)."""
    root = tmp_path / "deep"
    root.mkdir()
    directory = root
    for _ in range(1100):
        directory /= "d"
        os.mkdir(directory)  # one level at a time: os.makedirs recurses too
    (directory / "a.txt").write_bytes(b"x" * 64)
    (root / "loop").symlink_to(root, target_is_directory=True)
    try:
        write_text(tmp_path / "flat", {"a.txt": b"x" * 64})
        flat = text(tmp_path / "flat", tmp_path / "cache", seq_len=7)
        assert len(text(root, tmp_path / "cache", seq_len=7)) == len(flat) > 0
    finally:  # removed here, deepest first: shutil.rmtree (pytest's clean-up) recurses too
        (directory / "a.txt").unlink()
        (root / "loop").unlink()
        while directory != root:
            directory.rmdir()
            directory = directory.parent


# ------------------------------------------------------------------------ loading and cache


@pytest.mark.parametrize("workers", [0, 1])
def test_epoch_loader_reads_token_batches(tmp_path: Path, workers: int) -> None:
    write_text(tmp_path / "root", FILES)
    for dataset in (
        synthetic(tmp_path / "cache", seq_len=16, num_samples=40),
        text(tmp_path / "root", tmp_path / "cache", seq_len=4, num_samples=20),
    ):
        loader = EpochLoader(dataset, 4, seed=0, num_workers=workers)
        batches = list(loader)
        assert len(batches) == len(dataset) // 4
        for inputs, targets in batches:
            assert inputs.shape == targets.shape == (4, dataset.seq_len)
            assert inputs.dtype == targets.dtype == torch.int64
        indices = loader.batch_indices()[0].tolist()
        assert torch.equal(fetch_batch(dataset, indices)[0], batches[0][0])


def stamps(directory: Path, name: str) -> tuple[int, int]:
    return os.stat(directory / name).st_ino, os.stat(directory / name).st_mtime_ns


def test_the_cache_is_reused_not_regenerated(tmp_path: Path) -> None:
    first = synthetic(tmp_path / "cache")
    assert first.generated
    before = {
        name: stamps(first.windows.path.parent, name) for name in (TOKENS_FILE, MANIFEST_NAME)
    }
    again = synthetic(tmp_path / "cache")
    assert not again.generated
    assert before == {name: stamps(again.windows.path.parent, name) for name in before}

    write_text(tmp_path / "root", FILES)
    assert text(tmp_path / "root", tmp_path / "cache").generated
    cached = text(tmp_path / "root", tmp_path / "cache", split="eval")
    assert not cached.generated
    entry = cached.windows.path.parent
    assert stamps(entry, TEXT_FILE) == stamps(
        text(tmp_path / "root", tmp_path / "cache").windows.path.parent, TEXT_FILE
    )
    # An edited file is a new entry: the cache never serves stale text.
    (tmp_path / "root" / "c.txt").write_bytes(b"new text")
    edited = text(tmp_path / "root", tmp_path / "cache")
    assert edited.generated and edited.windows.path.parent != entry


def test_the_dataset_configs_compose(tmp_path: Path) -> None:
    tokens = compose_config(["dataset=tokens", "dataset.seq_len=64"]).dataset
    config = OmegaConf.to_object(tokens)
    assert isinstance(config, DatasetConfig)
    assert config.spec.seq_len == 64 and config.spec.vocab_size == 256
    assert config.source.value == "synthetic"
    text_config = OmegaConf.to_object(
        compose_config(["dataset=text", f"dataset.root={tmp_path}"]).dataset
    )
    assert isinstance(text_config, DatasetConfig)
    assert text_config.source.value == "real" and text_config.root == str(tmp_path)
    # `root: ???` merged over the schema's null stays null (OmegaConf never lets ??? override a
    # value); the schema's check asks for it.
    with pytest.raises(ConfigError, match="dataset.root=None is invalid"):
        OmegaConf.to_object(compose_config(["dataset=text"]).dataset)
