"""The configuration of nopeinterp's own models (`model.cfg`).

Its fields carry TransformerLens' `HookedTransformerConfig` names, so code written for a TL
model reads ours the same way (`cfg.n_layers`, `cfg.d_head`, `cfg.device`, ...). Only what our
models use is here.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass
class ModelConfig:
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int  # the training context (only a learned position table is limited by it)
    act_fn: str = "relu"  # see nopeinterp.models.base.ACTIVATIONS
    normalization_type: str = "LN"  # "LN" (LayerNorm) or "RMS" (RMS norm, T5's and Llama's)
    eps: float = 1e-5
    use_attn_scale: bool = True  # divide the attention logits by sqrt(d_head)
    positional_embedding_type: str = "standard"  # "rotary" when a layer rotates q and k
    rotary_dim: int | None = None  # rotated dims per head
    rotary_base: float = 10000
    rotary_adjacent_pairs: bool = False  # GPT-J's interleaved pairs (else GPT-NeoX's halves)
    gated_mlp: bool = False  # act(x @ W_gate) * (x @ W_in + b_in), as Llama's
    seed: int | None = None
    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32
    init_weights: bool = True
    default_prepend_bos: bool = True  # to_tokens starts each text with the tokenizer's <bos>
    tokenizer_prepends_bos: bool | None = None  # the tokenizer adds <bos> itself
    attn_only: bool = False  # (read by TL's ActivationCache helpers: every block has an MLP)

    @property
    def attn_scale(self) -> float:
        return math.sqrt(self.d_head) if self.use_attn_scale else 1.0

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    @property
    def initializer_range(self) -> float:
        """The std of the initial weight matrices (GPT-2's 0.8 / sqrt(d_model), as TL's)."""
        return 0.8 / math.sqrt(self.d_model)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


__all__ = ["ModelConfig"]
