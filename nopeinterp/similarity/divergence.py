"""How differently two models attend: per-(example, layer) divergence of attention patterns.

The paper's analysis (Kazemnejad et al. 2023, Sec. 5 / App. F): run both models teacher-forced
on the same full sequences (prompt + target); for each layer, each pair of heads (one per
model) and each query row t, compare the two attention distributions over keys 0..t; average
over rows; keep the best-matching head pair per (example, layer).

What we compute by default, and how it differs from the official code
(McGill-NLP/length-generalization, src/analyzers/attention_kl_analyzer.py):

- metric: the true Jensen-Shannon divergence in nats (`jsd`, bounded by ln 2). The official
  "jsd" is 0.5 * (KL(M||P) + KL(M||Q)) -- see `nopeinterp.similarity.jsd.paper_jsd`.
- head reduction ("heads="): "min" over all Ha x Hb pairs (the paper's reducer), "hungarian"
  (one-to-one matching by scipy's linear_sum_assignment, mean over matched pairs: every head
  must find a partner, so one lucky pair cannot hide the rest) or "same" (head h vs head h).
  The official code only compares pairs from itertools.combinations(range(H), 2), so a model
  compared with itself never scores 0.
- rows: query row 0 is skipped by default (one key, attention 1 vs 1: always 0, it only
  dilutes the mean); the official code includes it.
- `paper_compat=True` reproduces the official computation: paper_jsd, its head pairs, min over
  them, row 0 included (unless include_first_row=False is passed). Its pairs, in the official
  code, are (NoPE head j, other model's head i) for i < j: with attention_divergence(nope,
  other) that is model_a head j vs model_b head i, i < j. The "heads" column then names the
  chosen pair "a-b".

Cost and memory. For each layer all Ha x Hb head pairs are done at once, over blocks of
query rows: the causal entries of each block of each pattern are packed into one vector per
head, and JSD summed over rows is 0.5 (sum p log p + sum q log q) - sum m log m, so only the
m log m term needs the pairwise [B, Ha, Hb, cells] tensor (processed in bounded chunks); the
blocks' sums add up to the sequence's. Data are streamed batch by batch; only the
per-(example, layer) scalars are kept, so peak memory does not grow with the number of
examples. Each model runs once per batch, and the passes advance layer by layer together
(`nopeinterp.probing._stream.AttentionRows.each_layer`), so one layer's attention per model
exists at a time, whatever the number of layers. On our models the patterns are computed
block by block from q and k, so no full [B, H, T, T] tensor exists; on others the layer's
`blocks.{l}.attn.hook_pattern` is read. The forward pass stops after the last requested
layer.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment

from nopeinterp.data import make_sequences
from nopeinterp.errors import check_choice
from nopeinterp.hooks import act_name
from nopeinterp.probing._stream import AttentionRows, row_blocks
from nopeinterp.progress import progress as progress_bar
from nopeinterp.similarity.jsd import LN2

HEAD_REDUCERS = ("min", "hungarian", "same")
METRICS = ("jsd", "paper_jsd")
# Largest pairwise tensor built at once (elements); 2**23 float32 = 32 MiB.
CHUNK_ELEMENTS = 1 << 23
COLUMNS = ["example", "length", "n_tokens", "split", "layer", "value", "heads", "metric", "reducer"]


# --- the vectorised core -------------------------------------------------------------------


def head_pair_divergence(
    pattern_a: torch.Tensor,
    pattern_b: torch.Tensor,
    valid_rows: torch.Tensor | None = None,
    *,
    metric: str = "jsd",
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Mean over valid query rows of the divergence of every head pair: [B, Ha, Hb].

    `pattern_a` [B, Ha, T, T], `pattern_b` [B, Hb, T, T]: causal attention patterns (row t
    a distribution over keys 0..t). `valid_rows` [B, T] bool: rows to average (default all).
    `metric`: "jsd" (true JSD, nats, clamped into [0, ln 2]) or "paper_jsd".
    Only entries with key <= query are read; the rest of each pattern is ignored.
    """
    if pattern_a.ndim != 4 or pattern_b.ndim != 4:
        raise ValueError("patterns must be [batch, head, query, key]")
    t_q, t_k = pattern_a.shape[2:]
    if t_q != t_k:
        raise ValueError(f"patterns must be square, got {tuple(pattern_a.shape)}")
    if valid_rows is None:
        valid_rows = torch.ones(pattern_a.shape[0], t_q, dtype=torch.bool, device=pattern_a.device)
    total = head_pair_divergence_sum(
        pattern_a, pattern_b, valid_rows, metric=metric, chunk_elements=chunk_elements
    )
    return mean_divergence(total, valid_rows.bool().sum(1), metric)


def mean_divergence(total: torch.Tensor, n_rows: torch.Tensor, metric: str) -> torch.Tensor:
    """[B, Ha, Hb] sums over rows (`head_pair_divergence_sum`) -> means over `n_rows` [B]."""
    if (n_rows == 0).any():
        raise ValueError(
            "an example has no query row to compare (a 1-token sequence with the first row "
            "excluded?); pass include_first_row=True or drop it"
        )
    out = total / n_rows[:, None, None].to(total.device, total.dtype)
    if metric == "jsd":
        out.clamp_(0.0, LN2)  # rounding only: each row's JSD is in [0, ln 2]
    return out


def head_pair_divergence_sum(
    pattern_a: torch.Tensor,
    pattern_b: torch.Tensor,
    valid_rows: torch.Tensor,
    row0: int = 0,
    *,
    metric: str = "jsd",
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Sum over the valid rows of a block of the divergence of every head pair: [B, Ha, Hb].

    `pattern_a` [B, Ha, R, N], `pattern_b` [B, Hb, R, N]: query rows row0..row0+R-1 over
    keys 0..N-1 (N >= row0 + R); `valid_rows` [B, R] bool. Sums of consecutive blocks add
    up to the whole sequence's (see `mean_divergence`).
    """
    check_choice(metric, METRICS, "metric", error=ValueError)
    if pattern_a.ndim != 4 or pattern_b.ndim != 4:
        raise ValueError("patterns must be [batch, head, query, key]")
    batch, n_a, n_q, n_k = pattern_a.shape
    n_b = pattern_b.shape[1]
    if pattern_b.shape[0] != batch or pattern_b.shape[2:] != (n_q, n_k) or n_k < row0 + n_q:
        raise ValueError(
            f"pattern shapes differ: {tuple(pattern_a.shape)} vs {tuple(pattern_b.shape)}"
        )
    # at least float32: the logs and sums of a bfloat16 model's patterns lose too much in it
    dtype = torch.promote_types(
        torch.promote_types(pattern_a.dtype, pattern_b.dtype), torch.float32
    )
    valid_rows = valid_rows.bool().to(pattern_a.device)
    rows, cols = torch.tril_indices(n_q, n_k, offset=row0, device=pattern_a.device)
    flat = rows * n_k + cols  # causal cells of a row-major [R, N] block

    def packed(pattern):  # [B, H, R, N] -> [B, H, cells]; index_select beats fancy indexing
        return pattern.reshape(*pattern.shape[:2], -1).index_select(-1, flat).to(dtype)

    keep = valid_rows[:, rows][:, None, :]  # [B, 1, cells]
    # Zero the entries of rows we skip (padding, row 0): xlogy(0, .) = 0 drops them from
    # every sum, and a NaN in a padded row cannot leak in.
    a = torch.where(keep, packed(pattern_a), 0.0)  # [B, Ha, cells]
    b = torch.where(keep, packed(pattern_b), 0.0)  # [B, Hb, cells]
    n_entries = rows.numel()
    if metric == "jsd":
        # sum over rows of JSD = 0.5 (sum p log p + sum q log q) - sum m log m
        self_a = torch.xlogy(a, a).sum(-1)  # [B, Ha]
        self_b = torch.xlogy(b, b).sum(-1)  # [B, Hb]
    out = torch.empty(batch, n_a, n_b, dtype=dtype, device=pattern_a.device)
    head_step = max(1, min(n_a, chunk_elements // max(1, n_b * n_entries)))
    batch_step = max(1, chunk_elements // max(1, head_step * n_b * n_entries))
    for b0 in range(0, batch, batch_step):
        bs = slice(b0, b0 + batch_step)
        for h0 in range(0, n_a, head_step):
            hs = slice(h0, h0 + head_step)
            pa, pb = a[bs, hs, None], b[bs, None]  # [bc, hc, 1, cells], [bc, 1, Hb, cells]
            m = pa + pb  # [bc, hc, Hb, cells]; in-place ops below: the one big temporary
            m.mul_(0.5)
            if metric == "jsd":
                m_log_m = torch.xlogy(m, m, out=m).sum(-1)
                total = 0.5 * (self_a[bs, hs, None] + self_b[bs, None]) - m_log_m
            else:  # 0.5 (KL(M||P) + KL(M||Q)) = sum m log m - 0.5 (m log p + m log q)
                total = (torch.xlogy(m, m) - 0.5 * (torch.xlogy(m, pa) + torch.xlogy(m, pb))).sum(
                    -1
                )
            out[bs, hs] = total
    return out


def paper_head_pairs(n_heads: int) -> list[tuple[int, int]]:
    """The official code's (model_a head, model_b head) pairs: (j, i) for i < j.

    It iterates `itertools.combinations(range(H), 2)` as (src, tgt) with src indexing the
    compared model and tgt the NoPE run; here model_a is NoPE (compare_attention's order).
    """
    return [(j, i) for i, j in itertools.combinations(range(n_heads), 2)]


def reduce_heads(matrix: np.ndarray, reducer: str) -> tuple[np.ndarray, list[str]]:
    """Per-example scalar and the head pairs it came from, from [B, Ha, Hb] matrices.

    reducer: "min", "hungarian", "same" or "paper_min" (min over `paper_head_pairs`).
    Pairs are written "a-b" (model_a head, model_b head), comma-separated when several.
    """
    check_choice(reducer, (*HEAD_REDUCERS, "paper_min"), "head reducer", error=ValueError)
    matrix = np.asarray(matrix, dtype=np.float64)
    batch, n_a, n_b = matrix.shape
    if reducer in ("min", "paper_min"):
        masked = matrix
        if reducer == "paper_min":
            allowed = np.zeros((n_a, n_b), dtype=bool)
            for i, j in paper_head_pairs(n_a):
                allowed[i, j] = True
            masked = np.where(allowed, matrix, np.inf)
        flat = masked.reshape(batch, -1)
        # nanargmin-like without the warning: inf beats nothing, so an all-inf row picks 0.
        best = np.argmin(np.where(np.isnan(flat), np.inf, flat), axis=1)
        values = flat[np.arange(batch), best]
        heads = [f"{k // n_b}-{k % n_b}" for k in best]
        return values, heads
    if reducer == "same":
        diag = np.diagonal(matrix, axis1=1, axis2=2)
        return diag.mean(1), [",".join(f"{h}-{h}" for h in range(n_a))] * batch
    values, heads = np.empty(batch), []  # "hungarian"
    for e in range(batch):  # the assignment solver is per matrix; B is small
        r, c = linear_sum_assignment(matrix[e])
        values[e] = matrix[e][r, c].mean()
        heads.append(",".join(f"{i}-{j}" for i, j in zip(r, c, strict=True)))
    return values, heads


# --- models ----------------------------------------------------------------------------------


def _resolve_layers(model_a, models_b: Mapping, layers) -> list[int]:
    n_a = model_a.cfg.n_layers
    if layers is None:
        for name, model_b in models_b.items():
            if model_b.cfg.n_layers != n_a:
                raise ValueError(
                    f"models have different numbers of layers ({n_a} vs "
                    f"{model_b.cfg.n_layers} for {name!r}); pass layers= to compare a subset"
                )
        return list(range(n_a))
    layers = [layers] if isinstance(layers, int) else sorted({int(x) for x in layers})
    n_min = min([n_a, *(m.cfg.n_layers for m in models_b.values())])
    bad = [x for x in layers if not 0 <= x < n_min]
    if not layers or bad:
        raise ValueError(f"layers {bad or layers} out of range for models with {n_min} layers")
    return layers


def check_compatible(model_a, model_b, name: str = "model_b") -> None:
    """ValueError unless the two models read the same token ids (same d_vocab)."""
    if model_a.cfg.d_vocab != model_b.cfg.d_vocab:
        raise ValueError(
            f"models have different vocabularies (d_vocab {model_a.cfg.d_vocab} vs "
            f"{model_b.cfg.d_vocab} for {name!r}): their attention on the same tokens is "
            "not comparable"
        )


def pattern_names_filter(layers: Iterable[int]):
    """names_filter admitting only blocks.{l}.attn.hook_pattern for `layers`."""
    wanted = frozenset(act_name("pattern", layer) for layer in layers)
    return lambda name: name in wanted


def attention_patterns(model, tokens, attention_mask=None, layers=None) -> dict[int, torch.Tensor]:
    """{layer: pattern [B, H, T, T]} from one teacher-forced pass caching only the patterns."""
    layers = list(range(model.cfg.n_layers)) if layers is None else list(layers)
    device = model.cfg.device
    tokens = tokens.to(device)
    mask = None if attention_mask is None else attention_mask.to(device).long()
    with torch.inference_mode():
        _, cache = model.run_with_cache(
            tokens,
            attention_mask=mask,
            names_filter=pattern_names_filter(layers),
            stop_at_layer=max(layers) + 1,  # later blocks and the unembedding are not needed
        )
    return {layer: cache[act_name("pattern", layer)] for layer in layers}


def _reducer_for(heads: str, paper_compat: bool, n_a: int, n_b: int, name: str) -> str:
    check_choice(heads, HEAD_REDUCERS, "heads", error=ValueError)
    if paper_compat:
        if heads != "min":
            raise ValueError("paper_compat=True uses the paper's own pairing; leave heads='min'")
        if n_a != n_b or n_a < 2:
            raise ValueError(
                f"paper_compat needs the same number (>= 2) of heads in both models, got "
                f"{n_a} and {n_b} for {name!r}"
            )
        return "paper_min"
    if heads == "same" and n_a != n_b:
        raise ValueError(f"heads='same' needs equal head counts, got {n_a} and {n_b} for {name!r}")
    return heads


def divergence_frames(
    model_a,
    models_b: Mapping,
    sets: Mapping,
    *,
    heads: str = "min",
    paper_compat: bool = False,
    include_first_row: bool | None = None,
    batch_size: int = 32,
    layers=None,
    progress: bool = True,
) -> dict[str, pd.DataFrame]:
    """`attention_divergence` of model_a against several models, running model_a once per batch,
    on resolved `sets` (split name -> `Sequences`, e.g. `Splits`).

    Returns {name: frame} with the columns of `attention_divergence`.
    """
    if not models_b:
        raise ValueError("no models to compare against")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for name, model_b in models_b.items():
        check_compatible(model_a, model_b, name)
    layers = _resolve_layers(model_a, models_b, layers)
    reducers = {
        name: _reducer_for(heads, paper_compat, model_a.cfg.n_heads, m.cfg.n_heads, name)
        for name, m in models_b.items()
    }
    metric = "paper_jsd" if paper_compat else "jsd"
    if include_first_row is None:
        include_first_row = paper_compat  # the official code averages row 0 in
    d_vocab = model_a.cfg.d_vocab

    meta = {"example": [], "length": [], "n_tokens": [], "split": []}
    results = {name: {"value": [], "heads": []} for name in models_b}  # [example][layer]
    bar = progress_bar(
        total=sum(len(s) for s in sets.values()),
        unit="ex",
        desc="attention divergence",
        disable=not progress,
    )
    n_seen = 0
    try:
        for split, sequences in sets.items():
            for batch in sequences.batches(batch_size):
                tokens = batch.tokens
                if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab):
                    raise ValueError(f"token ids outside the models' vocabulary [0, {d_vocab})")
                n = tokens.shape[0]
                valid = batch.attention_mask.bool()
                # no padding left after trimming: run without a mask (cheaper, same result)
                mask = None if bool(valid.all()) else batch.attention_mask
                n_tokens = valid.sum(1)
                if not include_first_row:
                    valid = valid.clone()
                    valid[:, 0] = False
                valid = valid.to(model_a.cfg.device)
                vals = {name: np.empty((n, len(layers))) for name in models_b}
                pair_names = {name: [[None] * len(layers) for _ in range(n)] for name in models_b}
                # one forward pass per model, all advancing layer by layer together
                # (AttentionRows.each_layer): one layer's patterns per model at a time, each
                # read by blocks of query rows; a model given twice runs once
                t = tokens.shape[1]
                everyone = {id(model_a): model_a, **{id(m): m for m in models_b.values()}}
                blocks = row_blocks(n, max(m.cfg.n_heads for m in everyone.values()), t)
                n_rows = valid.sum(1)
                passes = {
                    key: AttentionRows.each_layer(m, tokens, mask, layers)
                    for key, m in everyone.items()
                }
                for li, layer in enumerate(layers):
                    src = {}
                    for key, each in passes.items():
                        got, src[key] = next(each)
                        assert got == layer
                    src_a = src[id(model_a)]
                    for name, model_b in models_b.items():
                        src_b = src[id(model_b)]
                        total = 0
                        for r0, r1 in blocks:
                            pa = src_a.rows(layer, r0, r1)[1]
                            pb = src_b.rows(layer, r0, r1)[1].to(pa.device)
                            total = total + head_pair_divergence_sum(
                                pa, pb, valid[:, r0:r1], r0, metric=metric
                            )
                        del pa, pb, src_b
                        mat = mean_divergence(total, n_rows, metric)
                        v, h = reduce_heads(mat.cpu().numpy(), reducers[name])
                        vals[name][:, li] = v
                        for e in range(n):
                            pair_names[name][e][li] = h[e]
                    del src, src_a  # before the passes compute the next layer
                for each in passes.values():
                    each.close()
                for name in models_b:
                    results[name]["value"].extend(vals[name].tolist())
                    results[name]["heads"].extend(pair_names[name])
                meta["example"].extend(range(n_seen, n_seen + n))
                meta["length"].extend(int(x) for x in batch.lengths)
                meta["n_tokens"].extend(int(x) for x in n_tokens)
                meta["split"].extend([split] * n)
                n_seen += n
                bar.update(n)
    finally:
        bar.close()
    if n_seen == 0:
        raise ValueError("no examples in data: nothing to compare")

    frames = {}
    n_layers = len(layers)
    for name in models_b:
        frame = pd.DataFrame(
            {
                "example": np.repeat(meta["example"], n_layers),
                "length": np.repeat(meta["length"], n_layers),
                "n_tokens": np.repeat(meta["n_tokens"], n_layers),
                "split": np.repeat(np.array(meta["split"], dtype=object), n_layers),
                "layer": np.tile(layers, n_seen),
                "value": np.asarray(results[name]["value"]).reshape(-1),
                "heads": [h for row in results[name]["heads"] for h in row],
                "metric": metric,
                "reducer": reducers[name],
            },
            columns=COLUMNS,
        )
        frames[name] = frame
    return frames


def attention_divergence(
    model_a,
    model_b,
    data,
    *,
    heads: str = "min",
    paper_compat: bool = False,
    include_first_row: bool | None = None,
    batch_size: int = 32,
    layers=None,
    id_lengths: tuple[int, int] | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Divergence between the attention patterns of two models, per example and layer.

    data: anything `nopeinterp.data.make_sequences` takes: token ids [B, T] (every position
    real), a Batch-like object with `tokens` (+ right-padded `attention_mask`, `lengths`),
    `Sequences`, a mapping of split name -> those, or a task (the paper's protocol: pass
    `make_sequences(task, n_per_length=10)`). Sequences are run teacher-forced as given, in
    batches of one task length.
    heads: "min" | "hungarian" | "same" (see the module docstring).
    paper_compat: the official code's metric (paper_jsd) and head pairs; includes row 0
    unless include_first_row=False. include_first_row: default False (True if paper_compat).
    layers: subset of layers (needed when the models' layer counts differ).
    id_lengths: (lo, hi) to split token data into "ID"/"OOD" (else one split, "all").
    progress: report progress over examples (nopeinterp.progress).

    Returns a tidy DataFrame, one row per (example, layer): example (index in data order),
    length (the task's length, else the token count), n_tokens, split ("ID"/"OOD"/"all"),
    layer, value, heads (matched pairs "a-b,..." or the argmin pair), metric ("jsd" |
    "paper_jsd"), reducer ("min" | "hungarian" | "same" | "paper_min").
    Raises ValueError for incompatible models (d_vocab, n_layers without `layers`, head
    counts for "same"/paper_compat) and for empty data.
    """
    return divergence_frames(
        model_a,
        {"model_b": model_b},
        make_sequences(data, purpose="analysis", id_lengths=id_lengths),
        heads=heads,
        paper_compat=paper_compat,
        include_first_row=include_first_row,
        batch_size=batch_size,
        layers=layers,
        progress=progress,
    )["model_b"]
