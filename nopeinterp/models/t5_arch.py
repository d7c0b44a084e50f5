"""The paper's architecture: T5's decoder used as a decoder-only LM (`build_model(...,
arch="t5")`), for every positional encoding of the zoo.

Kazemnejad et al. train a transformers `T5Stack` without encoder (official
`src/models/custom_t5_decoder_only.py`). Against the default architecture (a pre-LayerNorm
block) it differs in:
  - T5's RMS norm (no mean, no bias, eps 1e-6), before attention, before the MLP and at the end;
  - no biases anywhere (the default's bias slots are zero buffers: not parameters, not saved);
  - a ReLU MLP with dropout after the ReLU (`T5MLP`);
  - unscaled attention logits, and the softmax in float32 whatever the weights' dtype;
  - the output tied to the token embedding, the last hidden state scaled by d_model^-0.5
    (`TiedUnembed`: `unembed.W_U` is `embed.W_E.T * d_model**-0.5`, so `ln_final(x) @ W_U`
    are the logits); dropout after the final norm;
  - d_model independent of n_heads x d_head (`d_head=`, T5's `d_kv`);
  - T5's initialisation (`T5PreTrainedModel._init_weights`, factor 1).
Dropout elsewhere (embeddings, attention weights, both residual branches) is the default
architecture's, which already sits where T5 puts it (`PEBlock`, `PEAttention`).

The positional encodings are the zoo's own modules; the T5 architecture picks the official
code's form where the two differ: Rotary on GPT-J interleaved pairs (`rotate_every_two`,
`cfg.rotary_adjacent_pairs`), ALiBi as +slope * key position (`ALiBiBias` form "keys"), the
sinusoidal embedding as all sines then all cosines (layout "halves"), a learned position table
initialised N(0, 1). T5's bias table is `rel_pos_bias.0` (the official block 0's
`relative_attention_bias`), shared by all layers. Hook names are the default architecture's
(`ln1.hook_scale`, `mlp.hook_post`, `attn.hook_pattern`, ...), so every analysis runs unchanged.
tests/test_t5_arch.py holds the t5 build to transformers' `T5Stack` and the other encodings
to references written from the official definitions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nopeinterp._tl import HookPoint
from nopeinterp.errors import check_choice

ARCH_TYPES = ("default", "t5")
T5_EPS = 1e-6  # T5Config.layer_norm_epsilon

_BIASES = ("b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U")


def _bias_to_buffer(module: nn.Module, name: str) -> None:
    """Replace the parameter `name` by a zero buffer of its shape (not trained, not saved)."""
    value = module._parameters.pop(name)
    module.register_buffer(name, torch.zeros_like(value.detach()), persistent=False)


class T5MLP(nn.Module):
    """T5's `DenseReluDense` with TL's MLP names: relu(x @ W_in) -> dropout -> @ W_out.
    Hooks: `hook_pre` (before the ReLU), `hook_post` (after it, before dropout)."""

    def __init__(self, cfg, dropout: float = 0.0):
        super().__init__()
        self.cfg = cfg
        self.dropout = dropout
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model, dtype=cfg.dtype))
        # the default MLP's bias slots (code reading them finds zeros), not parameters
        self.register_buffer("b_in", torch.zeros(cfg.d_mlp, dtype=cfg.dtype), persistent=False)
        self.register_buffer("b_out", torch.zeros(cfg.d_model, dtype=cfg.dtype), persistent=False)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x):
        post = self.hook_post(F.relu(self.hook_pre(x @ self.W_in)))
        if self.dropout and self.training:
            post = F.dropout(post, self.dropout, training=True)
        return post @ self.W_out


class TiedUnembed(nn.Module):
    """The output tied to the token embedding: logits = (x * d_model^-0.5) @ W_E.T, with
    dropout on x first in training (T5's dropout after the final norm). `W_U` is the
    equivalent unembedding matrix, `embed.W_E.T * d_model**-0.5` (computed, not stored)."""

    def __init__(self, cfg, embed: nn.Module, dropout: float = 0.0):
        super().__init__()
        self.cfg = cfg
        self._embed = [embed]  # outside the module tree: the state dict holds W_E once
        self.dropout = dropout
        self.scale = cfg.d_model**-0.5
        self.register_buffer("b_U", torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype), persistent=False)
        self.hook_in = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_vocab]

    @property
    def W_U(self) -> torch.Tensor:
        return self._embed[0].W_E.T * self.scale

    def forward(self, residual):
        residual = self.hook_in(residual)
        if self.dropout and self.training:
            residual = F.dropout(residual, self.dropout, training=True)
        return self.hook_out(F.linear(residual * self.scale, self._embed[0].W_E))


def make_t5_layout(model) -> None:
    """Turn a freshly built PETransformer (cfg with RMS norm, eps 1e-6, unscaled logits, and
    for rotary adjacent pairs: `build_model` sets these) into the T5 decoder layout, then
    initialise it T5's way. Called by PETransformer.__init__ for arch="t5"."""
    from nopeinterp.models.alibi import ALiBiBias
    from nopeinterp.models.ape import SinusoidalPosEmbed

    cfg = model.cfg
    for block in model.blocks:  # the norms are RMS norms already (cfg.normalization_type)
        block.mlp = T5MLP(cfg, model.dropout)
        block.attn.softmax_fp32 = True
        for name in _BIASES:
            if isinstance(block.attn._parameters.get(name), nn.Parameter):
                _bias_to_buffer(block.attn, name)
    model.unembed = TiedUnembed(cfg, model.embed, model.dropout)
    for module in model.modules():
        if isinstance(module, ALiBiBias):
            module.form = "keys"
        if isinstance(module, SinusoidalPosEmbed):
            module.layout = "halves"
    if cfg.init_weights:
        t5_init(model)


def t5_init(model) -> None:
    """T5's initialisation (transformers' `T5PreTrainedModel._init_weights`, factor 1) of the
    weights T5 has; PE modules T5 lacks (FIRE, Kerple, learned temperatures) keep theirs.
    Seeded with the model's cfg.seed."""
    cfg = model.cfg
    d_model, inner = cfg.d_model, cfg.n_heads * cfg.d_head
    generator = torch.Generator().manual_seed(cfg.seed or 0)

    def normal(param, std):
        with torch.no_grad():
            values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
            param.copy_(values.to(param.dtype))

    normal(model.embed.W_E, 1.0)
    if hasattr(model, "pos_embed") and isinstance(
        getattr(model.pos_embed, "W_pos", None), nn.Parameter
    ):
        normal(model.pos_embed.W_pos, 1.0)  # the official abs_learned table, without its file
    for block in model.blocks:
        attn = block.attn
        normal(attn.W_Q, (d_model * cfg.d_head) ** -0.5)
        normal(attn.W_K, d_model**-0.5)
        normal(attn.W_V, d_model**-0.5)
        normal(attn.W_O, inner**-0.5)
        normal(block.mlp.W_in, d_model**-0.5)
        normal(block.mlp.W_out, cfg.d_mlp**-0.5)
    for bias in getattr(model, "rel_pos_bias", []):
        normal(bias.W_bias, d_model**-0.5)


def check_arch(arch: str) -> None:
    check_choice(arch, ARCH_TYPES, "arch", error=ValueError)


__all__ = ["ARCH_TYPES", "T5MLP", "TiedUnembed", "make_t5_layout", "t5_init"]
