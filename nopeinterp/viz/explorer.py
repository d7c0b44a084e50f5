"""Attention explorer: a small offline UI (no server) that draws the attention patterns of
several models (an `ExplorerData`) as heatmaps with the tokens on the axes.

    data = explorer_data({"nope": m0, "t5": m1, "alibi": m2}, examples, labels=tokenizer)
    Page("report").section("Attention").add(data).page.write("index.html")

`nopeinterp.similarity.explorer.explorer_data` computes the patterns (an `ExplorerData`, in
`nopeinterp.results`); this module only draws them: nothing here runs a model.
The UI: selects for the left model (NoPE by default), the reference model, layer, head (or the
mean over heads) and example; both heatmaps redraw with Plotly.react on every change.
"""

from __future__ import annotations

import html

from nopeinterp.errors import NopeinterpError
from nopeinterp.results import QUANT, ExplorerData  # noqa: F401  (drawn here)

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
