"""Theorem 1 on trained models: layer-wise linear position probes per PE, vs random init.

    python analyses/position_probes.py [--checkpoints checkpoints] [--quick]

For every checkpoint of every task, `nopeinterp.probing.probe_position`: ridge
probes (regression: R2, MAE in positions; one-hot least-squares classifier: accuracy) on the
residual stream after each block (layer 0 = embeddings), fitted on ID-length sequences, scored
on held-out ID and on OOD lengths. Its baselines come in the same table: `random_init` (a fresh
model of the same config and PE through the same probe: Chi et al.'s control, since causal
attention alone carries position), `shuffled` (permuted labels) and `constant`. One tidy CSV
(every checkpoint, model/baseline, layer, split, metric), a markdown pivot of R2 and MAE
(trained and random_init, from `ProbeResult.pivot`), and a figure.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from _common import parser, print_written, run_script, task_filter, write_figure, write_table

from nopeinterp.zoo import find_checkpoints, over_seeds

SEED_VALUES = ["ID r2", "OOD r2", "ID r2 [random_init]", "OOD r2 [random_init]", "ID mae",
               "OOD mae", "ID mae [random_init]", "OOD mae [random_init]"]  # fmt: skip


def figure(table: pd.DataFrame):
    """R2 and MAE per layer: one line per PE (trained solid, random_init dashed), ID / OOD."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nopeinterp.viz.legend import Legend

    tasks = list(dict.fromkeys(table["task"]))
    panels = [(t, s) for t in tasks for s in ("ID", "OOD")]
    fig = make_subplots(
        rows=len(panels), cols=2, vertical_spacing=0.25 / max(len(panels), 1),
        subplot_titles=[f"{t} {s}: {m}" for t, s in panels for m in ("R²", "MAE (positions)")],
    )  # fmt: skip
    names = list(dict.fromkeys(table["checkpoint"]))
    legend = Legend(names)
    for row, (task, split) in enumerate(panels, start=1):
        for col, metric in enumerate(("r2", "mae"), start=1):
            t = table[(table.task == task) & (table.split == split) & (table.metric == metric)]
            for (name, model), g in t.groupby(["checkpoint", "model"], sort=False):
                if model not in ("trained", "random_init"):
                    continue
                g = g.sort_values("layer")
                label = name if model == "trained" else f"{name} [random_init]"
                fig.add_trace(
                    go.Scatter(
                        x=g.layer, y=g.value, **legend.entry(label),
                        mode="lines+markers" if model == "trained" else "lines",
                        line=dict(color=legend.color(name),
                                  dash=None if model == "trained" else "dash"),
                    ),
                    row=row, col=col,
                )  # fmt: skip
            fig.update_xaxes(title_text="layer (0 = embeddings)", dtick=1, row=row, col=col)
    fig.update_layout(
        title="Linear position probes per layer (dashed: same PE, random init)",
        height=330 * len(panels), template="plotly_white",
    )  # fmt: skip
    return fig


def main(argv=None) -> list[Path]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n-train", type=int, default=None, help="probe sequences (512; --quick 48)")
    p.add_argument("--n-eval", type=int, default=None, help="ID/OOD sequences (256; --quick 24)")
    args = p.parse_args(argv)
    n_train = args.n_train or (48 if args.quick else 512)
    n_eval = args.n_eval or (24 if args.quick else 256)
    from nopeinterp.probing import probe_position

    tables, pivots = [], []
    for info in find_checkpoints(args.checkpoints, task_filter(args)):
        t0, c0 = time.perf_counter(), time.process_time()
        result = probe_position(info.path, n_train=n_train, n_eval=n_eval, progress=args.progress)
        ident = {"checkpoint": info.name, "task": info.task, "pe": info.pe, "seed": info.seed}
        tables.append(result.table.assign(**ident))
        pivot = result.pivot().reset_index()
        for i, (k, v) in enumerate(ident.items()):
            pivot.insert(i, k, v)
        pivots.append(pivot)
        print(
            f"  probed {info.name} in {time.perf_counter() - t0:.1f} s "
            f"({time.process_time() - c0:.1f} s CPU)",
            flush=True,
        )
    table = pd.concat(tables, ignore_index=True)
    front = ["checkpoint", "task", "pe", "seed"]
    table = table[front + [c for c in table.columns if c not in front]]
    pivot = pd.concat(pivots, ignore_index=True)
    by_pe = over_seeds(pivot, ["task", "pe", "layer"], [v for v in SEED_VALUES if v in pivot])

    pd.set_option("display.width", 250)
    print("\n== Position probes: R2 / MAE per layer ([random_init] = same PE, untrained) ==")
    print(pivot.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    out = Path(args.out)
    setting = (
        f"Ridge probes on the residual stream (layer 0 = embeddings, l = after block l); "
        f"{n_train} probe-training sequences (ID lengths), {n_eval} held-out ID and {n_eval} "
        "OOD sequences. [random_init]: a fresh model with the same config and PE, same probe."
        + (" QUICK RUN (--quick): too few sequences for conclusions." if args.quick else "")
    )
    paths = [
        *write_table(table, out, "position_probes", title="Position probes (tidy)", notes=setting),
        *write_table(pivot, out, "position_probes_pivot", title="Position probes: R2 and MAE per layer",
                     notes=setting),
        *write_table(by_pe, out, "position_probes_seeds",
                     title="Position probes per PE and layer over training seeds (mean, min, max)",
                     notes=setting),
        *write_figure(figure(table), out, "position_probes"),
    ]  # fmt: skip
    print_written(paths)
    return paths


if __name__ == "__main__":
    run_script(main)
