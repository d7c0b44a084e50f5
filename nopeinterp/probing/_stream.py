"""Streaming activations of a few hook points, batch by batch (only what is needed is cached)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from nopeinterp.data import Sequences
from nopeinterp.hooks import act_name, block_of
from nopeinterp.progress import progress as progress_bar


def batches_by_length(s: Sequences, batch_size: int) -> list[torch.Tensor]:
    """Indices of `s` in batches, longest sequences first (less padding per batch)."""
    order = torch.argsort(s.attention_mask.sum(1), descending=True, stable=True)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def plan_batches(s: Sequences, batch_size: int, items: list, item_bytes, *, max_cache_mb: float):
    """[(batch index, width t, [chunk of items])]: the batches of `batches_by_length` and, per
    batch, `items` in chunks whose caches fit `max_cache_mb` (at least one item per chunk),
    an item costing `item_bytes(n_sequences, t)`."""
    lens = s.attention_mask.sum(1)
    plan = []
    for idx in batches_by_length(s, batch_size):
        t = int(lens[idx].max())
        k = max(1, int(max_cache_mb * 2**20 // max(item_bytes(len(idx), t), 1)))
        plan.append((idx, t, [items[i : i + k] for i in range(0, len(items), k)]))
    return plan


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
    check_finite: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, dict]]:
    """Yield (batch index [b], attention mask [b, t], {key: activation}) for every batch.

    `hook_names`: key -> TL hook name, or a tuple of names that are cached together (the
    yielded value is then the tuple of activations). Only those are cached (names_filter), the forward pass
    stops after the last block needed, and when caching all hooks of a batch at once would
    exceed `max_cache_mb` (estimated as `bytes_per_item(t)` per hook and sequence), the hooks
    are split over several passes of that batch, so memory is bounded by the budget rather
    than by the number of layers. Sequences are batched in order of length (less padding).
    Non-finite activations at real tokens raise a NopeinterpError naming the first hook,
    unless `check_finite` is False (a control model: the caller reports its degenerate
    statistics instead).
    """
    groups = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in hook_names.items()}
    keys = sorted(groups, key=lambda k: max(block_of(n) for n in groups[k]))
    plan = plan_batches(
        s, batch_size, keys, lambda n, t: bytes_per_item(t) * n, max_cache_mb=max_cache_mb
    )
    total = sum(len(chunks) for _, _, chunks in plan)
    with (
        torch.inference_mode(),
        progress_bar(total=total, desc=desc, disable=not progress, leave=False) as bar,
    ):
        device = model.cfg.device
        for idx, t, chunks in plan:
            tokens = s.tokens[idx, :t]
            mask = s.attention_mask[idx, :t]
            # the model runs on its own device; what is yielded is on the CPU, where the
            # probes' and scores' float64 statistics are accumulated
            on_device = (tokens.to(device), mask.to(device))
            for chunk in chunks:
                names = {n for k in chunk for n in groups[k]}
                stop = max(block_of(n) for n in names) + 1
                _, cache = model.run_with_cache(
                    on_device[0],
                    attention_mask=on_device[1],
                    names_filter=lambda name, names=names: name in names,
                    stop_at_layer=stop,
                    return_cache_object=False,
                )
                for name in sorted(names, key=lambda n: (block_of(n), n)):  # the first one
                    if check_finite:
                        _check_finite(cache[name], mask, name, desc)
                yield (
                    idx,
                    mask,
                    {
                        k: cache[hook_names[k]].cpu()
                        if isinstance(hook_names[k], str)
                        else tuple(cache[n].cpu() for n in groups[k])
                        for k in chunk
                    },
                )
                del cache
                bar.update(1)


def _check_finite(activation: torch.Tensor, mask: torch.Tensor, name: str, desc: str) -> None:
    """NopeinterpError when an activation [batch, pos, ...] is NaN or infinite at a real
    token (padding is left out: it may be anything)."""
    from nopeinterp.errors import NopeinterpError

    real = activation
    if tuple(activation.shape[:2]) == tuple(mask.shape):
        real = activation[mask.to(activation.device).bool()]
    if not bool(torch.isfinite(real).all()):
        raise NopeinterpError(
            f"{desc}: non-finite activations (NaN or infinity) at {name}; the model "
            "overflows or is damaged, so no number of this analysis would mean anything"
        )


# Cells (batch x heads x query rows x keys) per block of query rows: the block's scores and
# pattern, and the analyses' temporaries on them, are a few times this, whatever the length.
ROW_BLOCK_CELLS = 2**19


def row_blocks(n_batch: int, n_heads: int, n_pos: int, cells: int | None = None):
    """[(start, stop)] blocks of query rows covering 0..n_pos-1, each of at most `cells`
    (default ROW_BLOCK_CELLS) cells, or one row."""
    cells = ROW_BLOCK_CELLS if cells is None else cells
    rows = max(1, cells // max(n_batch * n_heads * n_pos, 1))
    return [(r0, min(n_pos, r0 + rows)) for r0 in range(0, n_pos, rows)]


class AttentionRows:
    """One batch's attention at some layers, served by blocks of query rows.

    `rows(layer, start, stop)` -> (scores or None, pattern): [batch, head, stop - start, stop],
    query rows start..stop-1 over keys 0..stop-1 (the later keys are causally masked).

    Where every requested layer can compute a block of rows from its own q and k
    (`attention_rows`, as our attention layers do), one teacher-forced pass caches only q and k
    ([batch, pos, head, d_head] per layer) and each block is computed when asked for, so the
    full [batch, head, pos, pos] tensors never exist: memory grows with the sequence length
    as one block does. Otherwise (stock TransformerLens models: hook names only) the pass
    caches ``hook_pattern`` (and ``hook_attn_scores`` with `scores=True`) of the layers and
    blocks are slices of them.
    """

    def __init__(self, model, tokens, attention_mask, layers, *, scores: bool = False):
        self.model, self.scores, self.layers = model, scores, list(layers)
        self.mask = attention_mask
        attns = {layer: self._attn(model, layer) for layer in self.layers}
        self.by_rows = all(a is not None for a in attns.values())
        if self.by_rows:
            self.attns = attns
            names = {
                layer: tuple(act_name(h, layer) for h in a.qk_hook_names)
                for layer, a in attns.items()
            }
        else:
            kinds = ("hook_attn_scores", "hook_pattern") if scores else ("hook_pattern",)
            names = {layer: tuple(act_name(h, layer) for h in kinds) for layer in layers}
        wanted = frozenset(n for v in names.values() for n in v)
        device = model.cfg.device
        with torch.inference_mode():
            _, cache = model.run_with_cache(
                tokens.to(device),
                attention_mask=None if attention_mask is None else attention_mask.to(device),
                names_filter=lambda name: name in wanted,
                stop_at_layer=max(self.layers) + 1,
                return_cache_object=False,
            )
        self.cache = {layer: tuple(cache.pop(n) for n in names[layer]) for layer in self.layers}
        del cache

    @staticmethod
    def _attn(model, layer):
        blocks = getattr(model, "blocks", None)
        attn = getattr(blocks[layer], "attn", None) if blocks is not None else None
        ok = attn is not None and hasattr(attn, "attention_rows") and attn.rows_supported()
        return attn if ok else None

    @classmethod
    def layer_bytes(cls, model, n_batch: int, n_pos: int, scores: bool = False) -> int:
        """What one layer's cache holds (to group layers under a memory budget)."""
        cfg = model.cfg
        if all(cls._attn(model, layer) is not None for layer in range(cfg.n_layers)):
            return 2 * n_batch * n_pos * cfg.n_heads * cfg.d_head * 4
        return (2 if scores else 1) * n_batch * cfg.n_heads * n_pos * n_pos * 4

    def rows(self, layer: int, start: int, stop: int):
        if self.by_rows:
            q, k = self.cache[layer]
            with torch.inference_mode():
                scores, pattern = self.attns[layer].attention_rows(q, k, start, stop, self.mask)
            return (scores if self.scores else None), pattern
        *scores, pattern = self.cache[layer]
        cut = (slice(None), slice(None), slice(start, stop), slice(0, stop))
        return (scores[0][cut] if scores else None), pattern[cut]

    def release(self, layer: int) -> None:
        self.cache.pop(layer, None)


def attention_batches(
    model,
    s: Sequences,
    layers,
    *,
    batch_size: int,
    scores: bool,
    max_cache_mb: float,
    progress: bool,
    desc: str,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, AttentionRows, list[int]]]:
    """Yield (batch index [b], attention mask [b, t], AttentionRows, its layers) over `s`,
    batch by batch (longest first) and, within a batch, in groups of layers whose caches fit
    `max_cache_mb` (at least one layer per group)."""
    plan = plan_batches(
        s,
        batch_size,
        sorted(layers),
        lambda n, t: AttentionRows.layer_bytes(model, n, t, scores),
        max_cache_mb=max_cache_mb,
    )
    total = sum(len(groups) for _, _, groups in plan)
    with progress_bar(total=total, desc=desc, disable=not progress, leave=False) as bar:
        for idx, t, groups in plan:
            tokens, mask = s.tokens[idx, :t], s.attention_mask[idx, :t]
            for group in groups:
                yield idx, mask, AttentionRows(model, tokens, mask, group, scores=scores), group
                bar.update(1)


def attention_groups(model, s: Sequences, layers, opts, *, scores: bool, desc: str):
    """`attention_batches` with the options' batch size, cache budget and progress: yields
    (real [B, T] bool mask, the batch's query-row blocks, its AttentionRows, the group of
    layers cached together), for the analyses that read whole attention rows."""
    for _, mask, attention, group in attention_batches(
        model,
        s,
        layers,
        batch_size=opts.batch_size,
        scores=scores,
        max_cache_mb=opts.max_cache_mb,
        progress=opts.progress,
        desc=desc,
    ):
        yield (
            mask.bool(),
            row_blocks(mask.shape[0], model.cfg.n_heads, mask.shape[1]),
            attention,
            group,
        )
