"""Accuracy-vs-length figure: one panel per task, each on its own length axis, with the
training (ID) range of that task shaded."""

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopeinterp.viz.legend import Legend


def _label(model: str, task: str) -> str:
    """'copy-nope-seed1' on task 'copy' -> 'nope-seed1' (the legend is shared by the panels)."""
    prefix = f"{task}-"
    return model[len(prefix) :] if model.startswith(prefix) else model


def accuracy_figure(table, title="Exact match vs length") -> go.Figure:
    """`table`: EvalResult.table (model, task, length, split, accuracy, evaluable). Several
    tasks get one panel each (lengths mean different things per task); a model's colour and
    legend entry are shared across panels."""
    tasks = list(dict.fromkeys(table["task"])) if "task" in table else [None]
    fig = make_subplots(
        rows=1,
        cols=len(tasks),
        subplot_titles=[str(t) for t in tasks] if len(tasks) > 1 else None,
        shared_yaxes=True,
        horizontal_spacing=0.06,
    )
    legend = Legend()
    for col, task in enumerate(tasks, start=1):
        rows_t = table if task is None else table[table["task"] == task]
        for model, rows in rows_t.groupby("model", sort=False):
            label = _label(str(model), str(task)) if task is not None else str(model)
            rows = rows.sort_values("length")
            fig.add_trace(legend.line(label, rows["length"], rows["accuracy"]), row=1, col=col)
        id_lengths = rows_t.loc[rows_t["split"] == "ID", "length"]
        if len(id_lengths):
            fig.add_vrect(
                x0=id_lengths.min() - 0.5,
                x1=id_lengths.max() + 0.5,
                fillcolor="lightgray",
                opacity=0.35,
                line_width=0,
                annotation_text="training lengths",
                annotation_position="top left",
                row=1,
                col=col,
            )
        not_evaluable = rows_t[~rows_t["evaluable"].astype(bool)]
        if len(not_evaluable):
            fig.add_trace(
                go.Scatter(
                    x=not_evaluable["length"],
                    y=[0] * len(not_evaluable),
                    mode="markers",
                    marker_symbol="x",
                    marker_color="red",
                    **legend.entry("not evaluable (past APE table)"),
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="length", row=1, col=col)
    fig.update_yaxes(title_text="exact match", range=[-0.05, 1.05], row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def error_kinds_figure(table, *, panel: str, x: str, title="How the answers fail") -> go.Figure:
    """Stacked bars of the share of answers per kind (`ERROR_KINDS`: correct, too short, too
    long, wrong words): one bar per value of column `x`, one panel per value of `panel`. The
    kinds' columns hold shares; a bar sums to 1."""
    from nopeinterp.evaluation import ERROR_KINDS

    panels = list(dict.fromkeys(table[panel]))
    fig = make_subplots(
        rows=1,
        cols=len(panels),
        subplot_titles=[str(p) for p in panels],
        shared_yaxes=True,
        horizontal_spacing=0.03,
    )
    colors = dict(zip(ERROR_KINDS, ("#2ca02c", "#1f77b4", "#ff7f0e", "#d62728"), strict=True))
    for col, name in enumerate(panels, start=1):
        rows = table[table[panel] == name]
        for kind in ERROR_KINDS:
            fig.add_trace(
                go.Bar(
                    x=rows[x],
                    y=rows[kind],
                    name=kind,
                    marker_color=colors[kind],
                    legendgroup=kind,
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(title_text="share of test items", range=[0, 1.0], row=1, col=1)
    fig.update_layout(barmode="stack", title=title, height=420, width=max(600, 190 * len(panels)))
    return fig
