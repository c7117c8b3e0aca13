"""Transformer language models from `transformers` config classes (workloads.networks.lm):
the presets' parameter counts against the published figures, the layer list against the
Hugging Face model's own logits, the one-line errors, and a few training steps."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from tests.helpers import REPO_ROOT
from workloads.datasets.spec import DATASET_SPECS, DatasetSpec
from workloads.networks import build_network, layer_count, to_layer_list
from workloads.networks.lm import TokenLM, build_hf
from workloads.networks.ref import NetworkError, NetworkRef, canonical_json

PRESETS = REPO_ROOT / "conf" / "network"
GPT2_VOCAB, LLAMA3_VOCAB, BERT_VOCAB = 50257, 128256, 30522
# Published counts, not computed by this code (their embedding and head share one weight):
# GPT-2 124M/355M/774M/1.5B as Hugging Face's gpt2, gpt2-medium, gpt2-large, gpt2-xl;
# Llama 3.1 8B (its head is its own weight); BERT-large as Hugging Face's BertForMaskedLM.
TIED_PARAMETERS = {
    "gpt2_small": (124_439_808, 768, GPT2_VOCAB),
    "gpt2_medium": (354_823_168, 1024, GPT2_VOCAB),
    "gpt2_large": (774_030_080, 1280, GPT2_VOCAB),
    "gpt2_xl": (1_557_611_200, 1600, GPT2_VOCAB),
    "bert_large": (335_174_458, 1024, BERT_VOCAB),
}
LLAMA3_8B_PARAMETERS = 8_030_261_248
TINY = {
    "llama": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4},
    "bert": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    },
}


def _spec(seq_len: int = 16, vocab_size: int = 64) -> DatasetSpec:
    return DATASET_SPECS["tokens"].with_tokens(seq_len=seq_len, vocab_size=vocab_size)


def _ref(arch: str, config: dict[str, Any] | None = None, name: str | None = None) -> NetworkRef:
    return NetworkRef(
        name=name or arch, source="hf", arch=arch, options_json=canonical_json(config or {})
    )


def _preset(name: str, **overrides: Any) -> NetworkRef:
    """A conf/network preset as the config makes it (`NetworkConfig.ref`)."""
    preset = yaml.safe_load(Path(PRESETS / f"{name}.yaml").read_text())
    assert preset["source"] == "hf"
    return _ref(preset["arch"], {**preset["config"], **overrides}, preset["name"])


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    with torch.device("meta"):
        return build_hf(ref, spec)


# -- parameter counts ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", TIED_PARAMETERS)
def test_tied_presets_have_the_published_parameter_counts(name: str) -> None:
    published, width, vocab = TIED_PARAMETERS[name]
    spec = _spec(seq_len=512, vocab_size=vocab)
    assert _count(_meta(_preset(name, tie_word_embeddings=True), spec)) == published
    # the default: the head is its own weight (pipelines put it on another stage)
    assert _count(_meta(_preset(name), spec)) == published + vocab * width


def test_llama3_8b_has_llama_3_1_8b_parameter_count() -> None:
    model = _meta(_preset("llama3_8b"), _spec(seq_len=8192, vocab_size=LLAMA3_VOCAB))
    assert _count(model) == LLAMA3_8B_PARAMETERS
    assert len(list(model.children())) == 32 + 2


def test_a_preset_runs_on_meta_through_its_layer_list() -> None:
    """Shapes are traced on 'meta' (pipelines, describe): the blocks build their masks and
    rotary positions there too."""
    spec = _spec(seq_len=8192, vocab_size=LLAMA3_VOCAB)
    with torch.device("meta"):
        model = build_network(_preset("llama3_8b"), spec)
        hidden = torch.zeros((1, 8192), dtype=torch.int64)
        for layer in to_layer_list(_preset("llama3_8b"), model):
            hidden = layer(hidden)
    assert tuple(hidden.shape) == (1, 8192, LLAMA3_VOCAB)


def test_tiny_presets_follow_the_dataset() -> None:
    spec = _spec(seq_len=64, vocab_size=300)
    for name, blocks in (("llama_tiny", 4), ("gpt2_tiny", 4)):
        model = build_network(_preset(name), spec)
        assert isinstance(model, TokenLM)
        assert model.hf_model.config.vocab_size == 300
        assert layer_count(_preset(name), spec) == blocks + 2
        assert tuple(model(torch.zeros((2, 64), dtype=torch.int64)).shape) == (2, 64, 300)


# -- the layer list computes the Hugging Face model's logits ---------------------------------
@pytest.mark.parametrize("arch", TINY)
def test_token_lm_equals_the_hugging_face_model(arch: str) -> None:
    torch.manual_seed(0)
    model = build_hf(_ref(arch, TINY[arch]), _spec())
    assert isinstance(model, TokenLM)
    ids = torch.randint(0, 64, (3, 16))
    logits = model(ids)
    assert logits.shape == (3, 16, 64)
    torch.testing.assert_close(logits, model.hf_model(input_ids=ids).logits, rtol=0, atol=1e-5)
    layers = list(model.children())
    assert len(layers) == model.hf_model.config.num_hidden_layers + 2 == 2 + 2
    assert torch.equal(nn.Sequential(*layers)(ids), logits)
    # the same parameters as the Hugging Face model (no copies, none left out)
    assert {id(p) for p in model.parameters()} == {id(p) for p in model.hf_model.parameters()}


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_every_parameter_gets_a_gradient(arch: str) -> None:
    """DDP refuses a parameter its forward never uses."""
    model = build_hf(_ref(arch, TINY[arch]), _spec())
    model(torch.randint(0, 64, (2, 16))).sum().backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []


def test_dropout_is_off_and_the_head_untied() -> None:
    model = build_hf(_ref("gpt2", TINY["gpt2"]), _spec())
    assert isinstance(model, TokenLM)
    config = model.hf_model.config
    assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0, 0, 0)
    assert not config.tie_word_embeddings and not config.use_cache
    ids = torch.randint(0, 64, (2, 16))
    assert model.training and torch.equal(model(ids), model(ids))


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_a_copy_rebuilt_from_meta_and_the_state_dict_computes_the_same(arch: str) -> None:
    """FSDP's evaluation model: to_empty then load_state_dict; the rotary frequencies and
    BERT's position ids are buffers that must come back too."""
    model = build_hf(_ref(arch, TINY[arch]), _spec())
    whole = copy.deepcopy(model).to("meta").to_empty(device="cpu")
    whole.load_state_dict(model.state_dict())
    ids = torch.randint(0, 64, (2, 16))
    assert torch.equal(whole(ids), model(ids))


# -- bad input: one line naming the setting ----------------------------------------------------
@pytest.mark.parametrize(
    ("ref", "spec", "named"),
    [
        (_ref("gpt2", TINY["gpt2"]), DATASET_SPECS["cifar10"], "dataset=tokens or dataset=text"),
        (_ref("gpt2", {"vocab_size": 50}), _spec(vocab_size=64), "network.config.vocab_size"),
        (_ref("gpt2", {"n_positions": 8}), _spec(seq_len=16), "network.config.n_positions"),
        (
            _ref("llama", {"max_position_embeddings": 8}),
            _spec(seq_len=16),
            "network.config.max_position_embeddings",
        ),
        (_ref("nosuchmodel"), _spec(), "network.arch=nosuchmodel"),
        (_ref("t5"), _spec(), "network.arch=t5"),
        (_ref("gpt2", {"n_layers": 2}), _spec(), "network.config.n_layers"),
        (_ref("gpt2", {"n_layer": "six"}), _spec(), "network.config"),
        (_ref("gpt2", {"n_embd": 30, "n_head": 4}), _spec(), "network.config"),
    ],
)
def test_bad_input_names_the_setting(ref: NetworkRef, spec: DatasetSpec, named: str) -> None:
    with pytest.raises(NetworkError) as raised:
        build_hf(ref, spec)
    message = str(raised.value)
    assert named in message and "\n" not in message, message


def test_the_limits_name_both_numbers() -> None:
    with pytest.raises(
        NetworkError,
        match=r"dataset.seq_len=4096 is beyond network gpt2_small's "
        r"1024 positions \(network.config.n_positions\); "
        r"allowed: at most 1024",
    ):
        _meta(_preset("gpt2_small"), _spec(seq_len=4096, vocab_size=GPT2_VOCAB))
    with pytest.raises(
        NetworkError,
        match=r"dataset.vocab_size=200000 .*128256 .*"
        r"network.config.vocab_size",
    ):
        _meta(_preset("llama3_8b"), _spec(seq_len=128, vocab_size=200_000))
    with pytest.raises(
        NetworkError,
        match=r"not a field of GPT2Config \(did you mean "
        r"network.config.n_layer\?\)",
    ):
        build_hf(_ref("gpt2", {"n_layers": 2}), _spec())


# -- training ---------------------------------------------------------------------------------
def test_llama_tiny_learns_a_fixed_batch() -> None:
    torch.manual_seed(0)
    spec = _spec(seq_len=32, vocab_size=64)
    model = build_hf(_preset("llama_tiny"), spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids, targets = spec.example_batch(8, torch.Generator().manual_seed(0))
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(ids).flatten(0, -2), targets.flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
