"""Attention patterns of several models as compact data for the attention explorer.

    data = explorer_data({"nope": m0, "t5": m1, "alibi": m2}, examples, labels=tokenizer)
    Page("report").section("Attention").add(data).page.write("index.html")

`explorer_data` runs each model once per example through the shared
`nopeinterp.similarity.attention_patterns` (run_with_cache on `hook_pattern` only) and returns
an `ExplorerData` (`nopeinterp.results`): each pattern stored as its causal lower triangle,
quantised to one byte and base64-encoded, about 1.33 bytes per attention weight: 6 SCAN
checkpoints x 4 layers x 4 heads x 10 OOD examples (41-54 tokens) measured 1.34 MiB of JSON.
`nopeinterp.viz.explorer` draws it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from nopeinterp.errors import NopeinterpError
from nopeinterp.results import QUANT, ExplorerData, _encode
from nopeinterp.similarity.divergence import attention_patterns


def _labels_for(ids: list[int], labels) -> list[str]:
    if labels is None:
        return [str(i) for i in ids]
    if hasattr(labels, "convert_ids_to_tokens"):  # a tokenizer
        return [str(t) for t in labels.convert_ids_to_tokens(ids)]
    raise NopeinterpError("labels must be a tokenizer or a list of token-label lists")


def explorer_data(
    models: Mapping[str, object],
    examples: Sequence[torch.Tensor],
    *,
    labels=None,
    layers: Sequence[int] | None = None,
    example_names: Sequence[str] | None = None,
    left: str | None = None,
    reference: str | None = None,
) -> ExplorerData:
    """Attention patterns of `models` ({name: model}) on each example in `examples`.

    `examples`: 1-D token-id tensors (one unpadded sequence each; lengths may differ).
    `labels`: a tokenizer (`convert_ids_to_tokens`), one list of strings per example, or
    None (token ids shown). `layers`: model layers to keep (default all). `left` defaults to
    the first model whose name contains "nope" (pass it when there are several, e.g. NoPE and
    NoPE'), `reference` to the first other model.
    All models must have the same number of heads and the requested layers.
    """
    names = list(models)
    if len(names) < 2:
        raise NopeinterpError("the explorer needs at least two models (NoPE and a reference)")
    cfgs = {n: models[n].cfg for n in names}
    heads = {c.n_heads for c in cfgs.values()}
    if len(heads) != 1:
        raise NopeinterpError(f"explorer models must share n_heads; got {sorted(heads)}")
    min_layers = min(c.n_layers for c in cfgs.values())
    layers = list(range(min_layers)) if layers is None else [int(x) for x in layers]
    if not layers or any(not 0 <= x < min_layers for x in layers):
        raise NopeinterpError(f"layers must be in [0, {min_layers}); got {layers}")
    examples = [torch.as_tensor(e) for e in examples]
    if not examples or any(e.ndim != 1 or e.numel() == 0 for e in examples):
        raise NopeinterpError("examples must be non-empty 1-D token-id tensors (one each)")
    for n, c in cfgs.items():
        for e in examples:
            if int(e.min()) < 0 or int(e.max()) >= c.d_vocab:
                raise NopeinterpError(f"token ids outside model {n!r}'s vocabulary")
    if isinstance(labels, Sequence) and not isinstance(labels, str):
        tokens = [[str(t) for t in lab] for lab in labels]
        if len(tokens) != len(examples) or any(
            len(t) != e.numel() for t, e in zip(tokens, examples, strict=True)
        ):
            raise NopeinterpError("labels must give one label per token of every example")
    else:
        tokens = [_labels_for(e.tolist(), labels) for e in examples]
    example_names = (
        [f"example {i} ({e.numel()} tokens)" for i, e in enumerate(examples)]
        if example_names is None
        else [str(x) for x in example_names]
    )
    if len(example_names) != len(examples):
        raise NopeinterpError("example_names must name every example")
    if left is None:
        left = next((n for n in names if "nope" in n.lower()), names[0])
    if reference is None:
        reference = next(n for n in names if n != left)
    for which, n in (("left", left), ("reference", reference)):
        if n not in names:
            raise NopeinterpError(f"{which} model {n!r} is not one of {names}")

    n_heads = heads.pop()
    patterns: dict[str, list[list[list[str]]]] = {}
    for name in names:
        per = [[[""] * len(examples) for _ in range(n_heads)] for _ in layers]
        for ei, e in enumerate(examples):
            try:  # the model enforces its own limits (learned APE: n_ctx positions)
                pats = attention_patterns(models[name], e[None], None, layers)
            except ValueError as err:
                raise NopeinterpError(f"model {name!r} cannot read example {ei}: {err}") from None
            for li, layer in enumerate(layers):
                p = pats[layer][0].float().cpu().numpy()  # [H, T, T]
                for h in range(n_heads):
                    per[li][h][ei] = _encode(p[h])
        patterns[name] = per
    return ExplorerData(
        models=names,
        layers=layers,
        n_heads=n_heads,
        tokens=tokens,
        example_names=example_names,
        patterns=patterns,
        left=left,
        reference=reference,
        meta={"quantisation": f"uint8, p = byte / {QUANT}", "storage": "causal lower triangle"},
    )


__all__ = ["QUANT", "ExplorerData", "explorer_data"]
