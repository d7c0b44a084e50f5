"""Streaming activations of a few hook points, batch by batch and layer by layer: one forward
pass per batch hands each hook over as it is reached, and nothing is cached."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping

import torch

from nopeinterp._memory import release_free_memory
from nopeinterp.data import Sequences
from nopeinterp.hooks import act_name, block_of
from nopeinterp.progress import progress as progress_bar


def batches_by_length(s: Sequences, batch_size: int) -> list[torch.Tensor]:
    """Indices of `s` in batches, longest sequences first (less padding per batch)."""
    order = torch.argsort(s.attention_mask.sum(1), descending=True, stable=True)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class _Aborted(Exception):
    """Raised in a paused forward pass whose consumer went away: it unwinds the pass."""


def hook_stream(
    model, tokens: torch.Tensor, attention_mask, names, *, stop_at_layer: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hook name, activation) for each hook of `names`, in the order ONE forward pass
    reaches them, with nothing cached: the pass runs in a worker thread that waits at each of
    those hooks until the consumer asks for the next activation, so only the activation in
    hand (and what the pass itself holds) exists at a time, whatever the number of layers.

    The model runs `run_with_hooks(tokens, attention_mask=, stop_at_layer=)` in inference mode
    (every model of the protocol has it). An exception of the pass is raised here; leaving the
    loop early unwinds the pass. The consumer must drop its references to an activation before
    asking for the next one (or two layers' worth are held).
    """
    names = frozenset(names)
    handoff: queue.SimpleQueue = queue.SimpleQueue()
    resume = threading.Semaphore(0)
    aborted = threading.Event()

    def reader(name):  # by the name asked for (a bridge's hook may be an alias of another)
        def hook(activation, hook):
            if aborted.is_set():
                raise _Aborted
            handoff.put(("activation", name, activation))
            del activation
            resume.acquire()
            if aborted.is_set():
                raise _Aborted

        return hook

    def work():
        try:
            with torch.inference_mode():
                model.run_with_hooks(
                    tokens,
                    attention_mask=attention_mask,
                    fwd_hooks=[(name, reader(name)) for name in sorted(names)],
                    stop_at_layer=stop_at_layer,
                )
            handoff.put(("done",))
        except _Aborted:
            handoff.put(("done",))
        except BaseException as err:  # raised in the consumer's thread
            handoff.put(("error", err))

    worker = threading.Thread(target=work, name="nopeinterp-hook-stream", daemon=True)
    worker.start()
    try:
        while True:
            item = handoff.get()
            if item[0] == "done":
                return
            if item[0] == "error":
                raise item[1]
            name, activation = item[1], item[2]
            del item
            yield name, activation
            del activation
            resume.release()
    finally:
        if worker.is_alive():
            aborted.set()
            resume.release()
        worker.join()


def grouped_stream(stream: Iterator, groups: Mapping) -> Iterator[tuple[object, tuple]]:
    """Yield (key, activations) of `groups` (key -> tuple of hook names) from a `hook_stream`
    as soon as every hook of a group has come; a group's earlier activations wait for its
    last one (e.g. a layer's attention scores for its pattern)."""
    owners: dict[str, list] = {}
    for key, names in groups.items():
        for name in names:
            owners.setdefault(name, []).append(key)
    held: dict = {}
    done = set()
    for name, activation in stream:
        for key in owners.get(name, ()):
            held.setdefault(key, {})[name] = activation
        del activation
        for key in owners.get(name, ()):
            if len(held[key]) == len(groups[key]):
                got = held.pop(key)
                done.add(key)
                yield key, tuple(got[n] for n in groups[key])
                del got
    missing = [k for k in groups if k not in done]
    if missing:
        raise KeyError(f"the forward pass reached no hook {groups[missing[0]]}")


def stream(
    model,
    s: Sequences,
    hook_names: Mapping,
    *,
    batch_size: int,
    progress: bool,
    desc: str,
    check_finite: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, dict]]:
    """Yield (batch index [b], attention mask [b, t], {key: activation}) for every batch and
    key, one key at a time.

    `hook_names`: key -> TL hook name, or a tuple of names that come together (the yielded
    value is then the tuple of activations). One forward pass per batch, stopping after the
    last block needed, hands the hooks over layer by layer (`hook_stream`): nothing is
    cached, so memory holds one layer's activations, not all layers'. The caller drops each
    activation before taking the next. Sequences are batched in order of length (less
    padding). Non-finite activations at real tokens raise a NopeinterpError naming the first
    hook (in forward order), unless `check_finite` is False (a control model: the caller
    reports its degenerate statistics instead).
    """
    groups = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in hook_names.items()}
    stop = max(block_of(n) for names in groups.values() for n in names) + 1
    batches = batches_by_length(s, batch_size)
    lens = s.attention_mask.sum(1)
    with progress_bar(total=len(batches), desc=desc, disable=not progress, leave=False) as bar:
        device = model.cfg.device
        for idx in batches:
            t = int(lens[idx].max())
            tokens = s.tokens[idx, :t]
            mask = s.attention_mask[idx, :t]
            # the model runs on its own device; what is yielded is on the CPU, where the
            # probes' and scores' float64 statistics are accumulated
            passing = hook_stream(
                model, tokens.to(device), mask.to(device), _names(groups), stop_at_layer=stop
            )
            for key, activations in grouped_stream(passing, groups):
                if check_finite:
                    for name, i in zip(groups[key], range(len(activations)), strict=True):
                        _check_finite(activations[i], mask, name, desc)
                value = tuple(a.cpu() for a in activations)
                del activations
                yield idx, mask, {key: value[0] if isinstance(hook_names[key], str) else value}
                del value
            release_free_memory()  # the pass's temporaries, before the next batch's
            bar.update(1)


def _names(groups: Mapping) -> set[str]:
    return {n for names in groups.values() for n in names}


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
    (`attention_rows`, as our attention layers do), the pass keeps only q and k
    ([batch, pos, head, d_head] per layer) and each block is computed when asked for, so the
    full [batch, head, pos, pos] tensors never exist: memory grows with the sequence length
    as one block does. Otherwise (stock TransformerLens models: hook names only) it keeps
    ``hook_pattern`` (and ``hook_attn_scores`` with `scores=True`) of the layers and blocks
    are slices of them.

    `AttentionRows(model, tokens, mask, layers)` caches every layer of `layers` in one pass;
    `AttentionRows.each_layer(...)` hands the layers over one at a time from one pass
    (`hook_stream`), which is what the analyses use: one layer's attention at a time.
    """

    def __init__(self, model, tokens, attention_mask, layers, *, scores: bool = False, kept=None):
        self.model, self.scores, self.layers = model, scores, list(layers)
        self.mask = attention_mask
        self.attns, names = self._plan(model, self.layers, scores)
        self.by_rows = self.attns is not None
        if kept is None:  # one pass caching every layer's tensors
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
            kept = {layer: tuple(cache.pop(n) for n in names[layer]) for layer in self.layers}
            del cache
        self.cache = kept

    @classmethod
    def each_layer(cls, model, tokens, attention_mask, layers, *, scores: bool = False):
        """Yield (layer, AttentionRows of that layer alone) for `layers` in order, from ONE
        forward pass that waits while a layer is read (`hook_stream`). Drop each before taking
        the next: then one layer's tensors exist at a time."""
        layers = sorted(layers)
        attns, names = cls._plan(model, layers, scores)
        device = model.cfg.device
        passing = hook_stream(
            model,
            tokens.to(device),
            None if attention_mask is None else attention_mask.to(device),
            _names(names),
            stop_at_layer=max(layers) + 1,
        )
        for layer, tensors in grouped_stream(passing, names):
            rows = cls(model, None, attention_mask, [layer], scores=scores, kept={layer: tensors})
            del tensors
            yield layer, rows
            del rows

    @classmethod
    def _plan(cls, model, layers, scores: bool):
        """(our attention layers by layer, or None for stock ones; hook names by layer)."""
        attns = {layer: cls._attn(model, layer) for layer in layers}
        if all(a is not None for a in attns.values()):
            names = {
                layer: tuple(act_name(h, layer) for h in a.qk_hook_names)
                for layer, a in attns.items()
            }
            return attns, names
        kinds = ("hook_attn_scores", "hook_pattern") if scores else ("hook_pattern",)
        return None, {layer: tuple(act_name(h, layer) for h in kinds) for layer in layers}

    @staticmethod
    def _attn(model, layer):
        blocks = getattr(model, "blocks", None)
        attn = getattr(blocks[layer], "attn", None) if blocks is not None else None
        ok = attn is not None and hasattr(attn, "attention_rows") and attn.rows_supported()
        return attn if ok else None

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
    progress: bool,
    desc: str,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, AttentionRows, list[int]]]:
    """Yield (batch index [b], attention mask [b, t], AttentionRows, [its layer]) over `s`,
    batch by batch (longest first) and, within a batch, layer by layer from one forward pass
    (`AttentionRows.each_layer`): one layer's attention for one batch at a time."""
    batches = batches_by_length(s, batch_size)
    lens = s.attention_mask.sum(1)
    with progress_bar(total=len(batches), desc=desc, disable=not progress, leave=False) as bar:
        for idx in batches:
            t = int(lens[idx].max())
            tokens, mask = s.tokens[idx, :t], s.attention_mask[idx, :t]
            for layer, attention in AttentionRows.each_layer(
                model, tokens, mask, layers, scores=scores
            ):
                yield idx, mask, attention, [layer]
                del attention
            bar.update(1)


def attention_groups(model, s: Sequences, layers, opts, *, scores: bool, desc: str):
    """`attention_batches` with the options' batch size and progress: yields (real [B, T]
    bool mask, the batch's query-row blocks, its AttentionRows, [its layer]), for the analyses
    that read whole attention rows."""
    for _, mask, attention, group in attention_batches(
        model,
        s,
        layers,
        batch_size=opts.batch_size,
        scores=scores,
        progress=opts.progress,
        desc=desc,
    ):
        yield (
            mask.bool(),
            row_blocks(mask.shape[0], model.cfg.n_heads, mask.shape[1]),
            attention,
            group,
        )
        del attention
