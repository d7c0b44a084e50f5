"""TransformerLens hook names, built in one place (as TL's `utils.get_act_name` does).

    act_name("resid_post", 1)   -> "blocks.1.hook_resid_post"
    act_name("pattern", 0)      -> "blocks.0.attn.hook_pattern"
    act_name("hook_rot_q", 2)   -> "blocks.2.attn.hook_rot_q"
    block_of("blocks.3.attn.hook_pattern") -> 3

Names of the attention module (q, k, v, z, rot_q, rot_k, attn_scores, pattern, position_bias)
live under `blocks.{layer}.attn.`; the others (resid_pre, resid_mid, resid_post, attn_out,
mlp_out, ...) under `blocks.{layer}.`. A leading "hook_" is accepted.
"""

from __future__ import annotations

ATTN_HOOKS = frozenset(
    {"q", "k", "v", "z", "rot_q", "rot_k", "attn_scores", "pattern", "result", "position_bias"}
)


def act_name(name: str, layer: int) -> str:
    """The TL hook name of activation `name` in block `layer`."""
    short = name.removeprefix("hook_")
    where = "attn." if short in ATTN_HOOKS else ""
    return f"blocks.{int(layer)}.{where}hook_{short}"


def block_of(hook_name: str) -> int:
    """The block index of a `blocks.{layer}....` hook name."""
    return int(hook_name.split(".")[1])


__all__ = ["ATTN_HOOKS", "act_name", "block_of"]
