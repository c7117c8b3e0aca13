"""Transformer language models built from a Hugging Face `transformers` config class
(`network.source=hf`): random weights, nothing is downloaded.

`build_hf` builds the model `transformers` defines for the config (`GPT2LMHeadModel`,
`LlamaForCausalLM`, `BertForMaskedLM`, ...) and returns it as a `TokenLM`: an `nn.Sequential`
of single-tensor adapters around the model's own submodules (no copies): the token embedding,
one entry per transformer block, and the head. FSDP shards each entry (one unit per block) and
the pipelines split at block boundaries; the whole computes exactly the Hugging Face model's
logits (tests/unit/workloads/networks/test_lm.py compares them).

The config follows the dataset (vocabulary, positions) unless the preset fixes it, and is
changed from the transformers defaults where this benchmark needs it:
- dropout is off: trajectories are deterministic, and every distribution model computes the
  same thing;
- the input embedding and the output head are separate weights (`tie_word_embeddings=False`):
  a pipeline puts them on different stages, where a tied weight would be two weights;
- no special tokens (padding, begin, end): every token id of a token dataset is data;
- no KV cache (training only), and PyTorch's scaled-dot-product attention ("sdpa").
A setting given in `network.config` wins over each of these.

BERT (`BertForMaskedLM`) is trained here as a next-token model with full bidirectional
attention, so it can see the token it predicts: it is a shape and cost benchmark of BERT-large
(the same weights, activations and FLOPs), not MLM pretraining, and its loss means nothing.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workloads.datasets.spec import DatasetSpec
from workloads.networks.ref import NetworkError, NetworkRef

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel

CAUSAL = "causal"
SLIDING = "sliding"  # causal within a window (Mistral, Qwen2's sliding layers)
BIDIRECTIONAL = "bidirectional"
# Legacy keyword arguments a config with `rope_parameters` still accepts and converts.
_ROPE_LEGACY = ("rope_theta", "rope_scaling")
# A token dataset has no special tokens: every id is data (a padding id would get no gradient,
# and GPT-2's id 50256 lies outside a byte vocabulary).
_SPECIAL_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id")


# -- the adapters -----------------------------------------------------------------------------
class TokenLM(nn.Sequential):
    """A `transformers` language model as a layer list: token ids (N, T) int64 in, logits
    (N, T, vocab) out. Its children are the embedding, one adapter per transformer block and
    the head, each taking and returning one tensor, around the Hugging Face model's own
    submodules (`hf_model`, which computes the same logits)."""

    def __init__(self, hf_model: PreTrainedModel, layers: list[nn.Module]) -> None:
        super().__init__(*layers)
        # In a tuple, so that it is not registered: its modules are the layers' already.
        self._hf_model = (hf_model,)

    @property
    def hf_model(self) -> PreTrainedModel:
        """The Hugging Face model whose submodules the layers wrap (the same parameters)."""
        return self._hf_model[0]


class GPT2Embedding(nn.Module):
    """GPT-2's input: token embedding plus learned position embedding (then its dropout)."""

    def __init__(self, wte: nn.Module, wpe: nn.Module, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.drop(self.wte(ids) + self.wpe(positions))


class TokenEmbedding(nn.Module):
    """An embedding module called on the token ids alone (Llama's embed_tokens, BERT's
    embeddings with their own positions and token type 0)."""

    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed(ids)
        return out


class Block(nn.Module):
    """One transformer block on the hidden states alone: it builds what the Hugging Face
    model passes every block (positions, the attention mask for the config's attention
    implementation, rotary cos/sin from the model's own rotary module) as the model does."""

    def __init__(
        self, block: nn.Module, config: PreTrainedConfig, mask: str, rotary: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.block = block
        # The model's one rotary module, shared by every block (it holds no parameters, and
        # its forward moves its frequencies to the input's device: stages may differ).
        self.rotary = rotary
        self.config = config
        self.mask = mask
        # Workers the sequence is split over between the blocks (sequence parallelism,
        # `workloads.networks.tensor_parallel`): this block's input holds 1/sequence_shards of
        # the tokens, and its attention sees them all.
        self.sequence_shards = 1

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        tokens = hidden.shape[1] * self.sequence_shards
        positions = torch.arange(tokens, device=hidden.device).unsqueeze(0)
        whole = (  # the mask and rotary see the whole sequence's shape; nothing allocated
            hidden
            if self.sequence_shards == 1
            else hidden.new_empty(1).expand(hidden.shape[0], tokens, *hidden.shape[2:])
        )
        extra: dict[str, Any] = {}
        if self.rotary is not None:
            extra["position_embeddings"] = self.rotary(whole, positions)
        out = self.block(
            hidden,
            attention_mask=_attention_mask(self.config, whole, self.mask),
            position_ids=positions,
            **extra,
        )
        return out[0] if isinstance(out, tuple) else out


class Head(nn.Module):
    """The final norm (if the model has one outside its head) and the vocabulary projection."""

    def __init__(self, norm: nn.Module, out: nn.Module) -> None:
        super().__init__()
        self.norm, self.out = norm, out

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.out(self.norm(hidden))
        return logits


def _attention_mask(config: PreTrainedConfig, hidden: torch.Tensor, kind: str) -> Any:
    """The mask the Hugging Face model builds for unpadded input: None for "sdpa" (which
    then uses its is_causal flag), a materialized mask for "eager". Positions are not passed:
    they are 0..T-1, and reading them to detect packed sequences would fail on 'meta'."""
    from transformers.masking_utils import (
        create_bidirectional_mask,
        create_causal_mask,
        create_sliding_window_causal_mask,
    )

    if kind == BIDIRECTIONAL:
        return create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=None)
    build = create_sliding_window_causal_mask if kind == SLIDING else create_causal_mask
    # The cache is passed by position: transformers renamed it (`past_key_values` until 5.17
    # at least, `cache` in 5.24), and transformers>=5.0 is what distbench asks for.
    return build(config, hidden, None, None)


# -- the supported architectures ----------------------------------------------------------------
def _gpt2_layers(model: Any) -> list[nn.Module]:
    body = model.transformer
    return [
        GPT2Embedding(body.wte, body.wpe, body.drop),
        *(Block(block, model.config, CAUSAL) for block in body.h),
        Head(body.ln_f, model.lm_head),
    ]


def _llama_layers(model: Any) -> list[nn.Module]:
    """Llama and the models of its layout (Mistral, Qwen2): RMSNorm, rotary, SwiGLU."""
    body, config = model.model, model.config
    return [
        TokenEmbedding(body.embed_tokens),
        *(
            Block(layer, config, _decoder_mask(config, index), body.rotary_emb)
            for index, layer in enumerate(body.layers)
        ),
        Head(body.norm, model.lm_head),
    ]


def _decoder_mask(config: PreTrainedConfig, index: int) -> str:
    """Causal, or sliding-window causal where the model uses it for block `index`."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return SLIDING if layer_types[index] == "sliding_attention" else CAUSAL
    return SLIDING if getattr(config, "sliding_window", None) is not None else CAUSAL


def _bert_layers(model: Any) -> list[nn.Module]:
    body, config = model.bert, model.config
    mask = CAUSAL if config.is_decoder else BIDIRECTIONAL
    return [
        TokenEmbedding(body.embeddings),
        *(Block(layer, config, mask) for layer in body.encoder.layer),
        Head(nn.Identity(), model.cls),
    ]


@dataclass(frozen=True)
class _Arch:
    model_class: str  # the transformers class built from the config
    # the layer list of a built model (its submodules are looked up by name)
    layers: Callable[[Any], list[nn.Module]]


ARCHS: dict[str, _Arch] = {
    "gpt2": _Arch("GPT2LMHeadModel", _gpt2_layers),
    "llama": _Arch("LlamaForCausalLM", _llama_layers),
    "mistral": _Arch("MistralForCausalLM", _llama_layers),
    "qwen2": _Arch("Qwen2ForCausalLM", _llama_layers),
    "bert": _Arch("BertForMaskedLM", _bert_layers),
}


# -- building -----------------------------------------------------------------------------------
def build_hf(ref: NetworkRef, spec: DatasetSpec) -> nn.Module:
    """The `transformers` model of `ref.arch` with the config fields `ref.options`, fitted to
    the token dataset `spec`, as a `TokenLM`. Raises NetworkError (one line, naming the
    setting) for an image dataset, an unknown or unsupported model type, an unknown config
    field, or a vocabulary or position limit below the dataset's."""
    if not spec.tokens:
        raise NetworkError(
            f"network {ref.name} is a language model and dataset={spec.name} "
            f"holds images; use dataset=tokens or dataset=text"
        )
    arch = _arch(ref)
    config = _config(ref, spec)
    import transformers

    model_class = getattr(transformers, arch.model_class)
    try:
        model = model_class(config)
    except (ValueError, TypeError, AttributeError) as err:
        raise NetworkError(
            f"network {ref.name} (network.arch={ref.arch}) cannot be built "
            f"from network.config: {_one_line(err)}"
        ) from None
    _tie_bert_output_bias(model)
    _persist_buffers(model)
    return TokenLM(model, arch.layers(model))


def _arch(ref: NetworkRef) -> _Arch:
    arch = ARCHS.get(ref.arch or "")
    if arch is not None:
        return arch
    allowed = ", ".join(ARCHS)
    from transformers import AutoConfig

    try:
        AutoConfig.for_model(ref.arch or "")
    except ValueError:
        raise NetworkError(
            f"network.arch={ref.arch} is not a transformers model type; allowed: {allowed}"
        ) from None
    raise NetworkError(
        f"network.arch={ref.arch} has no layer adapter here (embedding, "
        f"blocks, head); allowed: {allowed}"
    )


def _config(ref: NetworkRef, spec: DatasetSpec) -> PreTrainedConfig:
    """The config: the dataset's vocabulary and positions, this benchmark's defaults (module
    docstring), then `ref.options`; its limits checked against the dataset."""
    from transformers import AutoConfig

    arch = ref.arch or ""
    default = AutoConfig.for_model(arch)
    options = ref.options
    for key, value in options.items():
        _check_field(default, key)
        _check_value(default, key, value)
    positions = _positions_field(default)
    fields: dict[str, Any] = {
        "vocab_size": spec.vocab_size,
        positions: max(getattr(default, positions), spec.seq_len),
        **_benchmark_defaults(default),
        **options,
    }
    from huggingface_hub.errors import StrictDataclassError  # a field of the wrong type

    try:
        config = AutoConfig.for_model(arch, attn_implementation=_attention(arch), **fields)
    except (ValueError, TypeError, StrictDataclassError) as err:
        raise NetworkError(
            f"network {ref.name}: network.config is invalid for "
            f"network.arch={arch}: {_one_line(err)}"
        ) from None
    _check_limits(ref, spec, config, positions)
    return config


def _check_field(default: PreTrainedConfig, key: str) -> None:
    """Config classes keep unknown keyword arguments silently: a misspelt field would build
    the default model, so every field must be one the default config has."""
    if hasattr(default, key) or (key in _ROPE_LEGACY and hasattr(default, "rope_parameters")):
        return
    known = [*default.to_dict(), *default.attribute_map]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean network.config.{close[0]}?)" if close else ""
    raise NetworkError(f"network.config.{key} is not a field of {type(default).__name__}{hint}")


# The config fields that name an activation function (GPT-2's and BERT's, Llama's).
_ACTIVATION_FIELDS = ("activation_function", "hidden_act")
# A size field's name: counts and widths, each at least 1 (`n_embd`, `num_hidden_layers`,
# `intermediate_size`, `max_position_embeddings`, `head_dim`).
_SIZE_FIELD = re.compile(r"(n_\w+|num_\w+|\w+_size|\w+_dim|\w+_embeddings|\w+_positions)")


def _check_value(default: PreTrainedConfig, key: str, value: Any) -> None:
    """NetworkError (one line naming `network.config.<key>`) for a value no model is built
    with: a number that is not finite, a size below 1, an activation transformers has not.
    Checked here, with the config, since the model's own code fails on them only when it is
    built, with a message of its own (or trains to NaN)."""
    where = f"network.config.{key}={value!r} is invalid"
    if isinstance(value, float) and not math.isfinite(value):
        raise NetworkError(f"{where}: allowed: a finite number")
    if key in _ACTIVATION_FIELDS and isinstance(value, str):
        from transformers.activations import ACT2FN

        if value not in ACT2FN:
            close = difflib.get_close_matches(value, list(ACT2FN), n=3)
            raise NetworkError(
                f"{where}: not an activation of transformers (transformers.activations."
                f"ACT2FN){'; close: ' + ', '.join(close) if close else ''}"
            )
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if numeric and _SIZE_FIELD.fullmatch(key) and value < 1:
        raise NetworkError(f"{where}: a size, allowed: 1 or more")
    if numeric and ("eps" in key or "epsilon" in key) and value <= 0:
        raise NetworkError(f"{where}: allowed: a positive number (a norm's epsilon)")


def _positions_field(config: PreTrainedConfig) -> str:
    """The config's name for the position limit (`n_positions` for GPT-2)."""
    name: str = config.attribute_map.get("max_position_embeddings", "max_position_embeddings")
    return name


def _benchmark_defaults(default: PreTrainedConfig) -> dict[str, Any]:
    fields: dict[str, Any] = {"use_cache": False, "tie_word_embeddings": False}
    for key, value in default.to_dict().items():
        if (
            ("dropout" in key or "pdrop" in key)
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        ):
            fields[key] = 0.0
    for key in _SPECIAL_TOKENS:
        if getattr(default, key, None) is not None:
            fields[key] = None
    return fields


def _attention(arch: str) -> str:
    """PyTorch's fused attention where the model supports it, else the plain one."""
    import transformers

    supports_sdpa = getattr(getattr(transformers, ARCHS[arch].model_class), "_supports_sdpa", False)
    return "sdpa" if supports_sdpa else "eager"


def _check_limits(
    ref: NetworkRef, spec: DatasetSpec, config: PreTrainedConfig, positions: str
) -> None:
    if config.vocab_size < spec.vocab_size:
        raise NetworkError(
            f"dataset.vocab_size={spec.vocab_size} is beyond network {ref.name}'s "
            f"{config.vocab_size} token ids (network.config.vocab_size); allowed: at most "
            f"{config.vocab_size}"
        )
    limit = getattr(config, positions)
    if limit < spec.seq_len:
        raise NetworkError(
            f"dataset.seq_len={spec.seq_len} is beyond network {ref.name}'s {limit} positions "
            f"(network.config.{positions}); allowed: at most {limit}"
        )


def _tie_bert_output_bias(model: PreTrainedModel) -> None:
    """BERT's MLM head keeps its output bias twice (`predictions.bias`, `decoder.bias`),
    one parameter that transformers ties only with the word embeddings: tie it always, or an
    untied head would hold a parameter its forward never uses (DDP refuses those)."""
    predictions = getattr(getattr(model, "cls", None), "predictions", None)
    if predictions is not None and predictions.decoder.bias is not predictions.bias:
        predictions.decoder.bias = predictions.bias


def _persist_buffers(model: PreTrainedModel) -> None:
    """Keep every buffer in the state dict (rotary frequencies, BERT's position ids): a copy
    rebuilt with `to_empty` and `load_state_dict` (FSDP's evaluation model) would otherwise
    hold uninitialized memory there."""
    for module in model.modules():
        module._non_persistent_buffers_set.clear()


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


# -- the shape the planner prices ----------------------------------------------------------------
DECODERS = ("gpt2", "llama", "mistral", "qwen2")
GATED = ("llama", "mistral", "qwen2")  # SwiGLU: gate, up and down projections


def decoder_shape(ref: NetworkRef, spec: DatasetSpec, seq_len: int | None) -> dict[str, Any]:
    """A decoder's sizes as its transformers config gives them (defaults filled in, the
    dataset's vocabulary and positions applied as when it is built), without building it:
    layers, hidden, heads, kv_heads, ffn, vocab, seq_len (`seq_len`, or None: the network's
    context), gated_mlp, tied_embeddings. Raises NetworkError for an architecture that is not a
    decoder (`DECODERS`)."""
    if ref.arch not in DECODERS:
        raise NetworkError(
            f"network={ref.name} is invalid for planning: the planner prices decoder language "
            f"models; allowed: the gpt2_* and llama* presets, or network=hf with network.arch "
            f"one of {', '.join(DECODERS)}"
        )
    config = _config(ref, spec)
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    return {
        "layers": int(config.num_hidden_layers),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
        "ffn": int(ffn or 4 * hidden),
        "vocab": int(config.vocab_size),
        "seq_len": int(seq_len or getattr(config, _positions_field(config))),
        "gated_mlp": ref.arch in GATED,
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }
