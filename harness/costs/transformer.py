"""A decoder transformer's sizes, FLOPs and saved activations, from its shape alone.

What the plan costs (`harness.costs.plan_step`) price on a GPU nobody here has: every figure
is counted per token from the shape, the way Narayanan et al. (2021) and Korthikanti et al.
(2022) count them, so that a plan of any degree divides them exactly.

Units: elements and FLOPs are counts; bytes are bytes. Symbols as in Korthikanti et al.:
`s` sequence length, `b` micro-batch size (sequences), `h` hidden size, `a` attention heads,
`t` tensor-parallel degree, `L` layers, `V` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class TransformerShape:
    """The shape that fixes a decoder's costs (GPT-2, Llama and their kin)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int  # grouped-query attention's key/value heads (= heads without it)
    ffn: int  # the MLP's inner width
    vocab: int
    seq_len: int
    gated_mlp: bool  # SwiGLU's three projections (Llama) instead of two (GPT-2)
    tied_embeddings: bool  # the output head shares the input embedding's weights
    # Dropout after attention and MLP (GPT as Korthikanti et al. counted it): one byte of mask
    # per element saved per dropout.
    dropout: bool = False
    # Attention computed by a fused kernel that keeps no score matrix (FlashAttention, PyTorch's
    # SDPA); False: scores and softmax materialised, as Megatron-LM's fused softmax did in 2022.
    flash_attention: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_width(self) -> int:
        """Width of K (and of V): the key/value heads' total."""
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one block's projections: Q, K, V, O and the MLP's two or three."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_width
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        return attention + mlp

    @property
    def layer_params(self) -> int:
        """One block's parameters: its projections and its two norms."""
        return self.layer_matmul_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output projection's own weights (none when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Every parameter: blocks, embedding, output head, final norm."""
        return (
            self.layers * self.layer_params + self.embedding_params + self.head_params + self.hidden
        )

    @property
    def layer_matmul_flops_per_token(self) -> int:
        """One block's projections, forward, per token: 2 FLOPs per weight."""
        return 2 * self.layer_matmul_params

    @property
    def attention_flops_per_token(self) -> int:
        """Scores and the weighted sum, forward, per token: 2 x 2 x s x h, counted over the
        whole sequence as model FLOPs are (a causal kernel skips about half: `causal_share`)."""
        return 4 * self.seq_len * self.hidden

    @property
    def head_flops_per_token(self) -> int:
        """The output projection onto the vocabulary, forward, per token."""
        return 2 * self.vocab * self.hidden

    @property
    def model_flops_per_token(self) -> int:
        """Forward and backward (3 x forward) of every block and the head, per token: the
        numerator of model FLOPs utilization (no recomputation counted, as Chowdhery et al. and
        Korthikanti et al. define it)."""
        forward = (
            self.layers * (self.layer_matmul_flops_per_token + self.attention_flops_per_token)
            + self.head_flops_per_token
        )
        return 3 * forward

    def layer_elementwise_elements_per_token(self) -> int:
        """Elements one block reads and writes outside its matrix multiplies, forward, per
        token: two norms (read h, write h), two residual adds (read 2h, write h), rotary or
        positional work on Q and K (read and write), and the MLP's activation (gated: read 2
        x ffn, write ffn; else read and write ffn). Memory-bound: priced at memory bandwidth."""
        h, kv, f = self.hidden, self.kv_width, self.ffn
        norms = 2 * 2 * h
        residuals = 2 * 3 * h
        rotary = 2 * (h + kv)
        activation = 3 * f if self.gated_mlp else 2 * f
        return norms + residuals + rotary + activation


class Recompute(str, Enum):
    """What a block recomputes in the backward pass instead of keeping."""

    none = "none"  # every activation kept
    full = "full"  # only the block's input kept; its whole forward runs again
    # Korthikanti et al.'s selective recomputation: the attention core (scores, softmax,
    # dropout, weighted sum) recomputed; with a fused (flash) attention kernel that keeps no
    # scores anyway, what it saves is the score-sized term only.
    attention = "attention"
    # Every `every`-th block recomputes fully, the rest keep everything (torchtitan's
    # per-layer selective checkpointing; distbench's `activation_checkpointing=selective`).
    layers = "layers"
    # torchtitan's per-operator selective checkpointing: matrix multiplies' outputs kept
    # except every second one, everything element-wise recomputed. Priced as half a forward
    # recomputed and half the activations kept: an approximation, said where it is used.
    operators = "operators"


@dataclass(frozen=True)
class Activations:
    """What a block keeps for its backward, per micro-batch, in bytes, and what it reruns."""

    kept_bytes: float  # per block, on one tensor-parallel rank
    recompute_share: float  # share of a block's forward run again in the backward


def saved_activation_bytes(
    shape: TransformerShape,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    bytes_per_element: int = 2,
    keep_scores: bool = True,
) -> float:
    """Bytes one block keeps for its backward on one tensor-parallel rank, counted tensor by
    tensor from what autograd saves (the method `harness.measure.saved_activations` measures on
    CPU): the first norm's input and output, Q, K and V, the attention output (a fused kernel
    keeps it and its log-sum-exp; an unfused one the `a x s x s` scores, softmax and dropout
    too), the second norm's input and output, and the MLP's inner tensors (gated: gate, up,
    activation and product, 4 x ffn; else pre- and post-activation, 2 x ffn), plus one byte per
    element of each dropout mask. Tensor parallelism splits what lies between the column- and
    row-parallel projections; sequence parallelism splits the rest too. `keep_scores=False`:
    an unfused kernel's scores left out (recomputed, Korthikanti et al.'s selective)."""
    flash_attention = shape.flash_attention
    h, f = shape.hidden, shape.ffn
    per_token_split = (h + 2 * shape.kv_width) + h + (4 * f if shape.gated_mlp else 2 * f)
    per_token_replicated = 4 * h  # the two norms' inputs and outputs
    tokens = micro_batch * shape.seq_len
    split = per_token_split * tokens * bytes_per_element / tp
    replicated = float(per_token_replicated * tokens * bytes_per_element)
    if sequence_parallel:
        replicated /= tp
    masks = 0.0
    if shape.dropout:
        # After attention's output projection and the MLP (replicated unless SP), and on the
        # attention probabilities when they are materialised.
        masks = 2 * h * tokens / (tp if sequence_parallel else 1)
    scores = 0.0
    if not flash_attention and keep_scores:
        # scores (2 bytes), softmax output (2), dropout mask (1) per head per position pair
        scores = (5 if shape.dropout else 4) * shape.heads * shape.seq_len * tokens / tp
    lse = 4 * shape.heads * tokens / tp if flash_attention else 0.0
    return split + replicated + masks + scores + lse


def block_activations(
    shape: TransformerShape,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    every: int = 1,
    bytes_per_element: int = 2,
) -> Activations:
    """What a block keeps and reruns under a recomputation policy (averaged over the blocks
    for `layers`: every `every`-th one recomputes)."""
    kept = saved_activation_bytes(shape, micro_batch, tp, sequence_parallel, bytes_per_element)
    block_input = (
        bytes_per_element
        * micro_batch
        * shape.seq_len
        * shape.hidden
        / (tp if sequence_parallel else 1)
    )
    if recompute is Recompute.none:
        return Activations(kept, 0.0)
    if recompute is Recompute.attention:
        # The scores are not kept (a fused kernel keeps none anyway); the attention core runs
        # again: its share of the block's forward FLOPs.
        per_token = shape.layer_matmul_flops_per_token + shape.attention_flops_per_token
        share = shape.attention_flops_per_token / per_token
        without_scores = saved_activation_bytes(
            shape, micro_batch, tp, sequence_parallel, bytes_per_element, keep_scores=False
        )
        return Activations(without_scores, share)
    if recompute is Recompute.full:
        return Activations(block_input, 1.0)
    if recompute is Recompute.operators:
        return Activations(block_input + kept / 2, 0.5)
    share = 1.0 / every
    return Activations((1 - share) * kept + share * block_input, share)


def korthikanti_layer_bytes(
    shape: TransformerShape,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
) -> float:
    """Korthikanti et al. (2022), section 4 and Table 2: one GPT block's activation bytes per
    tensor-parallel rank, as they count them (16-bit activations, dropout masks, unfused
    attention, 4h MLP): `sbh(34 + 5as/h)` with no parallelism; `sbh(10 + 24/t + 5as/(ht))` with
    tensor parallelism; `sbh/t (34 + 5as/h)` with sequence parallelism too; `34 sbh/t` with
    selective recomputation on top; `2sbh` with full recomputation. A cross-check printed beside
    `saved_activation_bytes`, exact only for the shapes it was written for."""
    s, b, h, a, t = shape.seq_len, micro_batch, shape.hidden, shape.heads, tp
    sbh = s * b * h
    if recompute is Recompute.full:
        return 2 * sbh
    attention = 0 if recompute is Recompute.attention else 5 * a * s / h
    if sequence_parallel:
        return sbh / t * (34 + attention)
    if t == 1:
        return sbh * (34 + attention)
    return sbh * (10 + 24 / t + attention / t)
