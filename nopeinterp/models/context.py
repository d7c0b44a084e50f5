"""What the converters of outside models share: the context cap and their error."""

from __future__ import annotations

from nopeinterp.errors import NopeinterpError

DEFAULT_MAX_CTX = 2048


class HFModelError(NopeinterpError, ValueError):
    """A Hugging Face model or directory that from_hf cannot convert faithfully."""


def _ctx(limit: int | None, n_ctx: int | None, arch: str, hard: bool) -> int:
    """The TL context: `n_ctx` if given, else the model's limit capped at DEFAULT_MAX_CTX."""
    if n_ctx is None:
        return min(limit or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
    if n_ctx < 1:
        raise HFModelError(f"n_ctx must be positive, got {n_ctx}")
    if hard and limit is not None and n_ctx > limit:
        raise HFModelError(f"{arch}: n_ctx={n_ctx} exceeds its {limit} learned positions")
    return n_ctx
