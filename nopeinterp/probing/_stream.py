"""Streaming activations of a few hook points, batch by batch (only what is needed is cached)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from tqdm.auto import tqdm

from nopeinterp.data import Sequences


def block_of(hook_name: str) -> int:
    return int(hook_name.split(".")[1])


def stream(
    model,
    s: Sequences,
    hook_names: Mapping,
    *,
    batch_size: int,
    bytes_per_item: int,
    max_cache_mb: float,
    progress: bool,
    desc: str,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, dict]]:
    """Yield (batch index [b], attention mask [b, t], {key: activation}) for every batch.

    `hook_names`: key -> TL hook name, or a tuple of names that are cached together (the
    yielded value is then the tuple of activations). Only those are cached (names_filter), the forward pass
    stops after the last block needed, and when caching all hooks of a batch at once would
    exceed `max_cache_mb` (estimated as `bytes_per_item(t)` per hook and sequence), the hooks
    are split over several passes of that batch, so memory is bounded by the budget rather
    than by the number of layers. Sequences are batched in order of length (less padding).
    """
    lens = s.attention_mask.sum(1)
    order = torch.argsort(lens, descending=True, stable=True)
    groups = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in hook_names.items()}
    keys = sorted(groups, key=lambda k: max(block_of(n) for n in groups[k]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    plan = []
    for idx in batches:
        t = int(lens[idx].max())
        per_hook = bytes_per_item(t) * len(idx)
        k = max(1, int(max_cache_mb * 2**20 // max(per_hook, 1)))
        plan.append((idx, t, [keys[i : i + k] for i in range(0, len(keys), k)]))
    total = sum(len(chunks) for _, _, chunks in plan)
    with (
        torch.inference_mode(),
        tqdm(total=total, desc=desc, disable=not progress, leave=False) as bar,
    ):
        for idx, t, chunks in plan:
            tokens = s.tokens[idx, :t]
            mask = s.attention_mask[idx, :t]
            for chunk in chunks:
                names = {n for k in chunk for n in groups[k]}
                stop = max(block_of(n) for n in names) + 1
                _, cache = model.run_with_cache(
                    tokens,
                    attention_mask=mask,
                    names_filter=lambda name, names=names: name in names,
                    stop_at_layer=stop,
                    return_cache_object=False,
                )
                yield (
                    idx,
                    mask,
                    {
                        k: cache[hook_names[k]]
                        if isinstance(hook_names[k], str)
                        else tuple(cache[n] for n in groups[k])
                        for k in chunk
                    },
                )
                del cache
                bar.update(1)
