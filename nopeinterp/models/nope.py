"""NoPE: no positional encoding at all. Position can only come from the causal mask."""

from nopeinterp.models.base import PETransformer


class NoPETransformer(PETransformer):
    pe = "nope"
