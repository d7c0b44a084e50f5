"""Accuracy-vs-length figure, with the training range shaded."""

import plotly.graph_objects as go


def accuracy_figure(table, title="Exact match vs length") -> go.Figure:
    fig = go.Figure()
    for model, rows in table.groupby("model", sort=False):
        rows = rows.sort_values("length")
        fig.add_trace(
            go.Scatter(x=rows["length"], y=rows["accuracy"], mode="lines+markers", name=str(model))
        )
    id_lengths = table.loc[table["split"] == "ID", "length"]
    if len(id_lengths):
        fig.add_vrect(
            x0=id_lengths.min() - 0.5,
            x1=id_lengths.max() + 0.5,
            fillcolor="lightgray",
            opacity=0.35,
            line_width=0,
            annotation_text="training lengths",
            annotation_position="top left",
        )
    not_evaluable = table[~table["evaluable"]]
    if len(not_evaluable):
        fig.add_trace(
            go.Scatter(
                x=not_evaluable["length"],
                y=[0] * len(not_evaluable),
                mode="markers",
                marker_symbol="x",
                marker_color="red",
                name="not evaluable (past APE table)",
            )
        )
    fig.update_layout(
        title=title, xaxis_title="length", yaxis_title="exact match", yaxis_range=[-0.05, 1.05]
    )
    return fig
