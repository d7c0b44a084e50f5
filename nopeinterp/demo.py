"""A tiny demo of the report page and the attention explorer, from untrained models.

    python -m nopeinterp.demo reports/demo/index.html

Builds small random-init NoPE, T5 and ALiBi models on the copy task (seconds on a CPU), and a
page with a figure, a long (collapsed) table and the attention explorer. It shows the page
machinery only: untrained models say nothing about the paper's claims.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from nopeinterp.similarity.explorer import explorer_data
from nopeinterp.viz.page import Page

TASK_OPTIONS = {"id_lengths": [2, 4], "ood_lengths": [5, 7]}


def demo_models(*, n_layers: int = 2, n_heads: int = 2, d_model: int = 32):
    """({name: untrained model}, tokenizer, [token tensors]) on the copy task."""
    from nopeinterp.models import build_model
    from nopeinterp.tasks import encode_examples, get_task, task_tokenizer

    task = get_task("copy", **TASK_OPTIONS)
    tok = task_tokenizer(task)
    models = {
        name: build_model(
            pe,
            n_layers=n_layers,
            n_heads=n_heads,
            d_model=d_model,
            d_vocab=len(tok),
            n_ctx=32,
            seed=seed,
            tokenizer=tok,
        )  # fmt: skip
        for name, pe, seed in [("nope", "nope", 0), ("t5", "t5", 0), ("alibi", "alibi", 0)]
    }
    batch = encode_examples(tok, task.generate(3, split="test", seed=0))
    examples = [
        row[: int(n)] for row, n in zip(batch.tokens, batch.attention_mask.sum(1), strict=True)
    ]
    return models, tok, examples


def demo_page(path: str | os.PathLike) -> Path:
    """Write the demo page to `path` and return it."""
    models, tok, examples = demo_models()
    data = explorer_data(models, examples, labels=tok)
    lengths = list(range(2, 8))
    acc = pd.DataFrame(
        [
            {"model": m, "length": n, "accuracy": 1.0 / (1 + i + n)}
            for i, m in enumerate(models)
            for n in lengths
        ]  # fmt: skip
    )
    fig = go.Figure(
        [go.Scatter(x=d["length"], y=d["accuracy"], name=m) for m, d in acc.groupby("model")]
    )
    fig.add_vrect(x0=1.5, x1=4.5, fillcolor="grey", opacity=0.15, line_width=0)
    fig.update_layout(title="Placeholder accuracy by length (ID range shaded)", height=380)
    page = Page("nopeinterp demo page", intro="Untrained models: this shows the machinery only.")
    (
        page.section("Length generalization", verdict="(demo) placeholder numbers, no claim")
        .add(fig)
        .add(acc, caption="accuracy by model and length")
        .section("Attention explorer", verdict="(demo) random-init attention patterns")
        .add(data)
    )
    return page.write(path)


if __name__ == "__main__":  # pragma: no cover - a manual demo
    out = demo_page(sys.argv[1] if len(sys.argv) > 1 else "reports/demo/index.html")
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
