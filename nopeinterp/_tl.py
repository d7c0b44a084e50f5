"""The one place nopeinterp touches TransformerLens' HookedTransformer API surface.

TL 3.9 warns on every HookedTransformer construction that the class is deprecated in favour
of TransformerBridge (TL 4). We pin TL < 4 and silence exactly that warning here, around the
constructor call (a module-level filter would be undone by pytest's and notebooks' own
filters), so a later port to TransformerBridge touches this module and nopeinterp/models/.
"""

import contextlib
import warnings

from transformer_lens import ActivationCache, HookedTransformer, HookedTransformerConfig
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.components import Attention, LayerNorm, TransformerBlock
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_offset_position_ids


@contextlib.contextmanager
def tl_deprecation_silenced():
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"HookedTransformer is deprecated", category=DeprecationWarning
        )
        yield


def init_kv_cache(model, batch: int):
    """An empty TransformerLens KV cache for `batch` sequences on the model's device."""
    return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)


__all__ = [
    "ActivationCache",
    "Attention",
    "HookPoint",
    "HookedTransformer",
    "HookedTransformerConfig",
    "LayerNorm",
    "TransformerBlock",
    "get_offset_position_ids",
    "init_kv_cache",
    "tl_deprecation_silenced",
]
