"""The figure of every result type, and its offline HTML report: the presenting side of
`nopeinterp.results.Result` (`result.figure()`, `result.save(dir)` reach here by name).

`draw(result, kind, **options)` finds the drawing for (result.name, kind) in `DRAW` (a result
type without one gets its table drawn); `sections(result)` lists the (heading, item) sections of
its saved HTML report; `write_result_html(path, result)` writes that report. Nothing here runs a
model: every figure is drawn from a result's tables and meta alone.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from nopeinterp.probing.erasure import CONDITIONS, PROBE_METRICS, TASK_METRICS
from nopeinterp.probing.heads import KINDS
from nopeinterp.probing.position import METRICS
from nopeinterp.viz.html import write_report
from nopeinterp.viz.lm import loss_by_position_figure, passkey_figure
from nopeinterp.viz.regions import region_figure


def _table_figure(result):
    """The table itself, for a result type without a drawing of its own."""
    t = result.table
    return go.Figure(
        go.Table(
            header={"values": list(t.columns)},
            cells={"values": [t[c].tolist() for c in t.columns]},
        )
    )


def _accuracy_figure(result):
    from nopeinterp.viz.evaluation import accuracy_figure

    return accuracy_figure(result.table)


def _accuracy_html_sections(result) -> list:
    return [
        ("Accuracy vs length", _accuracy_figure(result)),
        ("Summary", result.summary),
        ("Per length", result.table),
    ]


def _probe_position_figure(result, metrics: Sequence[str] = METRICS):
    from nopeinterp.viz.probing import probe_figure

    return probe_figure(result.table, metrics=metrics, title=result.meta.get("title"))


def _probe_position_html_sections(result) -> list:
    notes = (
        "<p>Linear probes for absolute position (0 = &lt;bos&gt;). r2/mae: ridge regression; "
        "accuracy: one-hot ridge (least-squares) classifier, positions beyond the largest "
        "training position count as wrong. Baselines: random_init (fresh model, same "
        "config), shuffled (probe on permuted labels), constant (train mean / mode).</p>"
    )
    meta = pd.DataFrame({"key": list(result.meta), "value": [str(v) for v in result.meta.values()]})
    return [
        ("Probe metrics per layer", _probe_position_figure(result)),
        ("Summary", notes),
        ("Table (layers x split/metric)", result.pivot(metrics=METRICS).reset_index()),
        ("Settings", meta),
    ]


def _distance_heatmap(result, split: str | None = None):
    from nopeinterp.viz.probing import distance_heatmap

    return distance_heatmap(result.table, split=split)


def _distance_histogram(
    result, layer: int | None = None, head: int | None = None, max_distance=None
):
    from nopeinterp.viz.probing import attention_distance_histogram

    return attention_distance_histogram(
        result.mass, layer=layer, head=head, max_distance=max_distance
    )


def _distance_figure(result, split: str | None = None):
    """The layer x head heatmap of the score (see also `histogram`)."""
    return _distance_heatmap(result, split)


def _distance_html_sections(result) -> list:
    sections = [(f"Distance dependence ({s})", _distance_heatmap(result, s)) for s in result.splits]
    sections.append(("Attention mass by distance", _distance_histogram(result)))
    sections.append(
        (
            "About the score",
            "<p>R&sup2; of the fit logit[n,m] &asymp; a<sub>row</sub> + f(n&minus;m) over "
            "valid causal cells, relative to the row-centred logits: 1 = the head's logits "
            "depend on relative distance only (up to per-row constants), 0 = not at all.</p>",
        )
    )
    sections.append(("Scores (split, layer x head)", result.pivot().reset_index()))
    return sections


def _erase_position_figure(result):
    """One panel per metric present, value per layer: none / leace / random, ID and OOD."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    t = result.table
    metrics = [m for m in (*PROBE_METRICS[:1], *TASK_METRICS) if m in set(t.metric)]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics)
    dash = {"none": "solid", "leace": "dash", "random": "dot"}
    color = {"ID": "#1f77b4", "OOD": "#d62728"}
    for col, metric in enumerate(metrics, start=1):
        for cond in CONDITIONS:
            for split in color:
                d = t[(t.metric == metric) & (t.condition == cond) & (t.split == split)]
                if d.empty:
                    continue
                d = d.sort_values("layer")
                fig.add_trace(
                    go.Scatter(
                        x=d.layer,
                        y=d.value,
                        mode="lines+markers",
                        line=dict(color=color[split], dash=dash[cond]),
                        name=f"{cond} {split}",
                        legendgroup=f"{cond} {split}",
                        showlegend=col == 1,
                    ),
                    row=1,
                    col=col,
                )
        fig.update_xaxes(title_text="erased layer (0 = embeddings)", dtick=1, row=1, col=col)
    fig.update_layout(title=result.meta.get("title") or result.title)
    return fig


def _erase_position_html_sections(result) -> list:
    return [
        (result.meta.get("title") or result.title, _erase_position_figure(result)),
        ("Probe R² after erasure (layers x condition/split)", result.pivot("r2").reset_index()),
        ("Table", result.table),
    ]


def _attention_sinks_figure(result, split: str | None = None):
    """First-token mass (left) and entropy with uniform's log(n) (right) against the
    number of keys of the row, one line per head (colour = layer)."""
    import plotly.colors
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    t = result.table
    split = split or (t.split.iloc[0] if len(t) else None)
    t = t[t.split == split]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["mass on the first token", "attention entropy (nats)"],
    )
    layers = sorted(t.layer.unique())
    palette = plotly.colors.qualitative.Plotly
    for (layer, head), d in t.groupby(["layer", "head"]):
        d = d.sort_values("n_keys")
        color = palette[layers.index(layer) % len(palette)]
        for col, y in ((1, "first_mass"), (2, "entropy")):
            fig.add_trace(
                go.Scatter(
                    x=d.n_keys,
                    y=d[y],
                    mode="lines",
                    line=dict(color=color, width=1.5),
                    name=f"L{layer} H{head}",
                    legendgroup=f"L{layer} H{head}",
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    ref = t.drop_duplicates("n_keys").sort_values("n_keys")
    fig.add_trace(
        go.Scatter(
            x=ref.n_keys,
            y=ref.uniform_entropy,
            mode="lines",
            line=dict(color="black", dash="dash"),
            name="uniform: log(n)",
        ),
        row=1,
        col=2,
    )
    fig.add_trace(
        go.Scatter(
            x=ref.n_keys,
            y=1 / ref.n_keys,
            mode="lines",
            line=dict(color="black", dash="dash"),
            name="uniform: 1/n",
        ),
        row=1,
        col=1,
    )
    fig.update_xaxes(title_text="keys in the row (n = query position + 1)")
    fig.update_layout(title=f"{result.meta.get('title') or result.title} ({split})")
    return fig


def _heads_figure(result, split: str | None = None):
    """Layer x head grid coloured by label, every score in the hover text."""
    import plotly.graph_objects as go

    t = result.table
    split = split or t.split.iloc[0]
    t = t[t.split == split]
    code = {k: i for i, k in enumerate(KINDS)}
    z = t.pivot(index="layer", columns="head", values="label")
    hover = t.assign(
        text=t.apply(
            lambda r: (
                f"L{r.layer} H{r['head']}: {r.label}<br>"
                + "<br>".join(f"{k} {r[k]:.3f}" for k in KINDS)
            ),
            axis=1,
        )
    ).pivot(index="layer", columns="head", values="text")
    fig = go.Figure(
        go.Heatmap(
            z=z.apply(lambda col: col.map(code)).astype(float).values,
            x=[f"head {h}" for h in z.columns],
            y=[f"layer {lay}" for lay in z.index],
            text=z.values,
            texttemplate="%{text}",
            hovertext=hover.values,
            hoverinfo="text",
            zmin=0,
            zmax=len(KINDS) - 1,
            colorscale="Turbo",
            showscale=False,
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"{result.meta.get('title') or result.title} ({split})")
    return fig


def _attention_similarity_figure(result):
    """Plotly figure: divergence per layer per ref (left), ID vs OOD bars (right)."""
    from nopeinterp.viz.similarity import comparison_figure

    return comparison_figure(result.table, metric=result.metric)


def _attention_similarity_html_sections(result) -> list:
    from nopeinterp.viz.similarity import (
        attention_heatmaps,
        distance_figure,
        layer_figure,
        split_bars,
    )

    label = "JSD (nats)" if result.metric == "jsd" else "paper_jsd"
    intro = (
        f"<p>metric: <b>{html.escape(result.metric)}</b>, head reduction: "
        f"<b>{html.escape(result.reducer)}</b>. Mean over examples with 95% bootstrap CIs "
        "(over examples); 'all' averages each example's layers first. Lower = attends "
        "more like NoPE. <code>nope_prime</code> (a second NoPE seed) is the noise floor."
        "</p>"
    )
    sections = [
        ("Setup", intro),
        ("Ranking (closest to NoPE first)", result.ranking),
        ("Divergence per layer", layer_figure(result.table, metric=label)),
        ("ID vs OOD", split_bars(result.table, metric=label)),
    ]
    pats, layer = result.example_patterns, result.example_layer
    if "nope" in pats:
        for ref, pattern in pats.items():
            if ref == "nope":
                continue
            fig = attention_heatmaps(pats["nope"], pattern, layer, names=("nope", ref))
            sections.append((f"Attention: nope vs {ref} (layer {layer}, example 0)", fig))
    if len(result.profile):
        sections.append(("Attention mass by distance (example 0)", distance_figure(result.profile)))
    return sections


def _paper_comparison_figure(result):
    import plotly.graph_objects as go

    fig = go.Figure()
    for side, color in (("ours", "#1f77b4"), ("paper", "#d62728")):
        t = result.mrr[result.mrr["side"] == side]
        fig.add_trace(
            go.Bar(
                name=side,
                x=t["pe"],
                y=t["mrr"],
                marker_color=color,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": (t["ci_high"] - t["mrr"]).tolist(),
                    "arrayminus": (t["mrr"] - t["ci_low"]).tolist(),
                },
            )
        )
    fig.update_layout(
        barmode="group",
        yaxis_title="MRR of OOD accuracy",
        title=f"MRR over {result.meta.get('n_splits')} splits (bootstrap over split x seed)",
    )
    return fig


def _paper_comparison_html_sections(result) -> list:
    return [
        (result.title, _paper_comparison_figure(result)),
        ("MRR", result.mrr),
        ("Which PEs the MRR intervals separate", result.separation),
        ("Rank agreement per split", result.agreement),
        ("Cells ranked by ties", result.ties),
        ("Per split and PE", result.table),
    ]


def _lm_loss_figure(result):
    return loss_by_position_figure(result.table, result.meta.get("contexts", {}))


def _lm_loss_passkey(result):
    return passkey_figure(result.passkey)


def _lm_loss_html_sections(result):
    out = [
        ("Loss by position", _lm_loss_figure(result)),
        ("Perplexity by length", result.perplexity),
    ]
    if result.passkey is not None and len(result.passkey):
        out += [("Passkey retrieval", _lm_loss_passkey(result)), ("Passkey", result.passkey)]
    return out


def _attention_regions_figure(result):
    return region_figure(result.by_layer)


def _attention_regions_html_sections(result):
    return [
        (result.meta.get("title") or result.title, _attention_regions_figure(result)),
        ("Mean over heads", result.by_layer),
        ("Per head", result.table),
    ]


DRAW = {
    ("attention_regions", "figure"): _attention_regions_figure,
    ("lm_loss", "figure"): _lm_loss_figure,
    ("lm_loss", "passkey"): _lm_loss_passkey,
    ("accuracy", "figure"): _accuracy_figure,
    ("probe_position", "figure"): _probe_position_figure,
    ("distance", "heatmap"): _distance_heatmap,
    ("distance", "histogram"): _distance_histogram,
    ("distance", "figure"): _distance_figure,
    ("erase_position", "figure"): _erase_position_figure,
    ("attention_sinks", "figure"): _attention_sinks_figure,
    ("heads", "figure"): _heads_figure,
    ("attention_similarity", "figure"): _attention_similarity_figure,
    ("paper_comparison", "figure"): _paper_comparison_figure,
}
SECTIONS = {
    "attention_regions": _attention_regions_html_sections,
    "lm_loss": _lm_loss_html_sections,
    "accuracy": _accuracy_html_sections,
    "probe_position": _probe_position_html_sections,
    "distance": _distance_html_sections,
    "erase_position": _erase_position_html_sections,
    "attention_similarity": _attention_similarity_html_sections,
    "paper_comparison": _paper_comparison_html_sections,
}


def draw(result, kind: str = "figure", **options):
    """The plotly Figure of `kind` ("figure", or e.g. "heatmap") for `result`."""
    fn = DRAW.get((result.name, kind))
    if fn is None:
        if kind != "figure":
            raise ValueError(f"{type(result).__name__} has no {kind!r} drawing")
        return _table_figure(result)
    return fn(result, **options)


def sections(result) -> list:
    """(heading, Figure | DataFrame | html str) sections of the result's saved HTML report."""
    fn = SECTIONS.get(result.name)
    if fn is not None:
        return fn(result)
    return [(result.meta.get("title") or result.title, draw(result)), ("Table", result.table)]


def write_result_html(path, result):
    """The result's offline HTML report (plotly.js embedded once) at `path`."""
    return write_report(path, result.meta.get("title") or result.title, sections(result))
