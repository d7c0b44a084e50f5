"""The one place nopeinterp touches TransformerLens' model API, under TL 3.9 and TL 4.x.

What the analyses need of a model is a small protocol, which both versions' models meet: the
TL hook names (`blocks.{i}.hook_resid_post`, `blocks.{i}.attn.hook_pattern`, ...),
`run_with_cache(tokens, attention_mask=, names_filter=, stop_at_layer=)` / `hooks()`, a `cfg`
with n_layers, n_heads, d_model, d_vocab, n_ctx, device and dtype, and a `tokenizer`.

Our own models (every PE, both architectures, hence every checkpoint) are built on
`HookedRootModule` and `HookPoint`, which both versions have (nopeinterp/models/base.py):
they build, load and run the same under TL 3.9 and 4.x.

Models imported from transformers (`from_hf`): under TL 3.9, TL's `HookedTransformer`
converts the weights into one (TL 3.9 warns on every HookedTransformer construction that the
class is deprecated; exactly that warning is silenced around the constructor call,
`tl_deprecation_silenced`, as a module-level filter would be undone by pytest's and
notebooks' own filters). TL 4.x removed `HookedTransformer` and `HookedTransformerConfig`:
there `from_hf` wraps the transformers model in a `TransformerBridge` in compatibility mode
without weight processing (`bridge`), so the hook values are the transformers model's own, as
under 3.9, and the analyses run on it. Under 4.x, `HookedTransformer`,
`HookedTransformerConfig` and `Attention` are None here, and `init_kv_cache` of an imported
model (TL's KV cache) raises `TLVersionError`.
"""

import contextlib
import warnings
from importlib.metadata import version

from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_offset_position_ids

from nopeinterp.errors import NopeinterpError

TL_VERSION = version("transformer-lens")
TL4 = int(TL_VERSION.split(".")[0]) >= 4


class TLVersionError(NopeinterpError, RuntimeError):
    """Something the installed TransformerLens version cannot do."""


if TL4:
    HookedTransformer = HookedTransformerConfig = Attention = None

    def _tl_kv_cache(model, batch: int):
        raise TLVersionError(
            f"KV-cache decoding of an imported model needs TransformerLens' HookedTransformer, "
            f"which TransformerLens {TL_VERSION} removed: install 'transformer-lens>=3.9,<4' "
            "for it"
        )

else:
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
    from transformer_lens.components import Attention

    def _tl_kv_cache(model, batch: int):
        return TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)


def init_kv_cache(model, batch: int):
    """An empty KV cache for `batch` sequences on the model's device: our models' own, or
    TransformerLens' for an imported HookedTransformer (TL 3.9)."""
    if hasattr(model, "init_kv_cache"):
        return model.init_kv_cache(batch)
    return _tl_kv_cache(model, batch)


@contextlib.contextmanager
def tl_deprecation_silenced():
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"HookedTransformer is deprecated", category=DeprecationWarning
        )
        yield


def bridge(hf_model, tokenizer=None, device=None, n_ctx: int | None = None):
    """A TL 4 `TransformerBridge` over a transformers causal LM (nothing downloaded), in
    compatibility mode (TL 3.9 hook names and shapes) with no weight processing: the hooks
    see what the transformers model computes, in its own basis."""
    import copy
    import logging

    from transformer_lens.model_bridge import TransformerBridge

    param = next(hf_model.parameters())
    config = hf_model.config
    # The bridge configures (changes) the tokenizer it is given and, given none, loads one by
    # the model's name: it gets a copy, or a one-token stand-in, and the model keeps the
    # caller's tokenizer as given (None: none).
    boot_tokenizer = copy.deepcopy(tokenizer) if tokenizer is not None else _stand_in_tokenizer()
    name = getattr(config, "_name_or_path", "") or type(hf_model).__name__
    tl_logger = logging.getLogger("transformer_lens")
    level = tl_logger.level
    tl_logger.setLevel(logging.ERROR)  # no warnings about the model not being on the Hub
    try:
        model = TransformerBridge.boot_transformers(
            name,
            hf_model=hf_model,
            tokenizer=boot_tokenizer,
            device=str(device if device is not None else param.device),
            dtype=param.dtype,
            n_ctx=n_ctx,
        )
    finally:
        tl_logger.setLevel(level)
    model.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    model._tokenizer = tokenizer  # past the setter, which would configure it again
    return model.eval()


def _stand_in_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")


__all__ = [
    "TL4",
    "TL_VERSION",
    "TLVersionError",
    "ActivationCache",
    "Attention",
    "HookPoint",
    "HookedRootModule",
    "HookedTransformer",
    "HookedTransformerConfig",
    "bridge",
    "get_offset_position_ids",
    "init_kv_cache",
    "tl_deprecation_silenced",
]
