"""Attention explorer: attention patterns of several models as compact data, and a small
offline UI (no server) that draws them as heatmaps with the tokens on the axes.

    data = explorer_data({"nope": m0, "t5": m1, "alibi": m2}, examples, labels=tokenizer)
    Page("report").section("Attention").add(data).page.write("index.html")

`explorer_data` runs each model once per example through the shared
`nopeinterp.similarity.attention_patterns` (run_with_cache on `blocks.{l}.attn.hook_pattern`
only; no TransformerLens import). Each pattern is stored as its causal lower triangle (row t
holds keys 0..t), quantised to one byte (round(p * 255)) and base64-encoded: about 1.33 bytes
per attention weight: 6 SCAN checkpoints x 4 layers x 4 heads x 10 OOD examples (41-54
tokens) measured 1.34 MiB of JSON.
The UI: selects for the left model (NoPE by default), the reference model, layer, head (or the
mean over heads) and example; both heatmaps redraw with Plotly.react on every change.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from nopeinterp.errors import NopeinterpError

QUANT = 255  # attention weight p is stored as round(p * QUANT) in one byte


def _encode(pattern: np.ndarray) -> str:
    """[T, T] attention pattern -> base64 of its quantised lower triangle (row-major)."""
    rows, cols = np.tril_indices(pattern.shape[0])
    q = np.rint(np.clip(pattern[rows, cols], 0.0, 1.0) * QUANT).astype(np.uint8)
    return base64.b64encode(q.tobytes()).decode("ascii")


def _decode(text: str, n: int) -> np.ndarray:
    """Inverse of `_encode`: [n, n] float array, NaN above the diagonal."""
    q = np.frombuffer(base64.b64decode(text), dtype=np.uint8)
    if q.size != n * (n + 1) // 2:
        raise NopeinterpError(f"explorer pattern has {q.size} values, expected for {n} tokens")
    out = np.full((n, n), np.nan)
    out[np.tril_indices(n)] = q / QUANT
    return out


@dataclass
class ExplorerData:
    """Attention patterns for the explorer: plain, JSON-serialisable data (no models).

    patterns[model][layer_index][head][example] is an encoded pattern (see module docstring);
    `layers` lists the model layer numbers the layer indices stand for.
    """

    models: list[str]
    layers: list[int]
    n_heads: int
    tokens: list[list[str]]  # token labels per example
    example_names: list[str]
    patterns: dict[str, list[list[list[str]]]]
    left: str  # the model drawn on the left by default (NoPE)
    reference: str  # the model drawn beside it by default
    meta: dict = field(default_factory=dict)

    def pattern(self, model: str, layer: int, head: int, example: int) -> np.ndarray:
        """[T, T] attention weights (dequantised; NaN above the diagonal)."""
        if model not in self.patterns:
            raise NopeinterpError(f"no model {model!r} in the explorer; have {self.models}")
        if layer not in self.layers:
            raise NopeinterpError(f"layer {layer} not in the explorer; have {self.layers}")
        li = self.layers.index(layer)
        return _decode(self.patterns[model][li][head][example], len(self.tokens[example]))

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ExplorerData:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as e:
            raise NopeinterpError(f"not explorer data: {e}") from None


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
    from nopeinterp.similarity import attention_patterns

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


_JS = r"""
(function (root) {
  var el = document.getElementById(root);
  var D = JSON.parse(document.getElementById(root + "-data").textContent);
  var sel = {};
  el.querySelectorAll("select[data-k]").forEach(function (s) { sel[s.dataset.k] = s; });
  function decode(b64, n) {
    var bin = atob(b64), z = [], k = 0;
    for (var t = 0; t < n; t++) {
      var row = new Array(n).fill(null);
      for (var s = 0; s <= t; s++) row[s] = bin.charCodeAt(k++) / __QUANT__;
      z.push(row);
    }
    return z;
  }
  function matrix(model, li, head, ex) {
    var n = D.tokens[ex].length, per = D.patterns[model][li];
    if (head !== "mean") return decode(per[+head][ex], n);
    var acc = null;
    per.forEach(function (h) {
      var z = decode(h[ex], n);
      if (acc === null) { acc = z; return; }
      for (var t = 0; t < n; t++) for (var s = 0; s <= t; s++) acc[t][s] += z[t][s];
    });
    for (var t = 0; t < n; t++) for (var s = 0; s <= t; s++) acc[t][s] /= per.length;
    return acc;
  }
  function draw(div, model, showScale) {
    var li = +sel.layer.value, head = sel.head.value, ex = +sel.example.value;
    var labels = D.tokens[ex].map(function (tok, i) { return i + ":" + tok; });
    var trace = {type: "heatmap", z: matrix(model, li, head, ex), x: labels, y: labels,
      zmin: 0, zmax: 1, colorscale: "Viridis", showscale: showScale, hoverongaps: false,
      hovertemplate: "query %{y}<br>key %{x}<br>attention %{z:.3f}<extra></extra>"};
    var what = head === "mean" ? "mean over heads" : "head " + head;
    // automargin: the margins grow to hold the token labels and the axis titles beside
    // them (fixed margins cut long labels and put "key" under the rotated ticks); the
    // title sits left, clear of the mode bar on the right
    var layout = {title: {text: model + ": layer " + D.layers[li] + ", " + what,
                          x: 0, xanchor: "left", xref: "paper", y: 1, yanchor: "bottom",
                          yref: "paper", pad: {b: 30}},
      xaxis: {title: {text: "key", standoff: 8}, type: "category", tickangle: -60,
              automargin: true},
      yaxis: {title: {text: "query", standoff: 8}, type: "category", autorange: "reversed",
              automargin: true},
      height: 520, margin: {l: 20, r: 20, t: 90, b: 20}};
    return Plotly.react(div, [trace], layout, {responsive: true});
  }
  function redraw() {
    return Promise.all([draw(root + "-a", sel.left.value, false),
                        draw(root + "-b", sel.ref.value, true)]);
  }
  Object.keys(sel).forEach(function (k) { sel[k].addEventListener("change", redraw); });
  redraw();
})("__ROOT__");
"""


def _select(key: str, label: str, options: list[tuple[str, str]], chosen: str) -> str:
    opts = "".join(
        f"<option value='{html.escape(v)}'{' selected' if v == chosen else ''}>"
        f"{html.escape(t)}</option>"
        for v, t in options
    )
    return f"<label>{html.escape(label)} <select data-k='{key}'>{opts}</select></label>"


def explorer_html(data: ExplorerData, *, element_id: str = "explorer") -> str:
    """The explorer as an HTML fragment for a page that already loads plotly.js
    (nopeinterp.viz.page.Page does; `Section.add(data)` calls this)."""
    if not all(c.isalnum() or c in "-_" for c in element_id):
        raise NopeinterpError(f"element_id must be letters, digits, - or _; got {element_id!r}")
    models = [(m, m) for m in data.models]
    controls = "".join(
        [
            _select("left", "model", models, data.left),
            _select("ref", "beside", models, data.reference),
            _select("layer", "layer", [(str(i), str(x)) for i, x in enumerate(data.layers)], "0"),
            _select(
                "head",
                "head",
                [(str(h), str(h)) for h in range(data.n_heads)] + [("mean", "mean")],
                "0",
            ),
            _select(
                "example", "example", [(str(i), n) for i, n in enumerate(data.example_names)], "0"
            ),
        ]
    )
    payload = data.to_json().replace("</", "<\\/")  # cannot close the script element
    js = _JS.replace("__ROOT__", element_id).replace("__QUANT__", str(QUANT))
    return (
        f"<div class='explorer' id='{element_id}'>"
        f"<div class='controls'>{controls}</div>"
        f"<div class='panels'><div id='{element_id}-a' class='plotly-graph-div'></div>"
        f"<div id='{element_id}-b' class='plotly-graph-div'></div></div>"
        f"<script type='application/json' id='{element_id}-data'>{payload}</script>"
        f"<script>{js}</script></div>"
    )
