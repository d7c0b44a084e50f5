"""The one shape every analysis result has (scikit-learn style: results are data).

    result.table          tidy pandas DataFrame (one row per observation)
    result.meta           plain dict (JSON-serialisable settings and counts)
    result.figure()       a plotly Figure drawn from the data alone (by nopeinterp.viz.results)
    result.save(dir)      {what: Path} of the files written; computes nothing

A result holds data only: no models, no tensors that need a forward pass to use. Subclasses
name their extra tables in `extra_tables`; their figures live in `nopeinterp.viz.results`
(results never import figure code); `save` writes
`<name>.csv` for the main table, `<name>_<extra>.csv` for each extra, `<name>_meta.json`
and `<name>.html` (figure, tables, settings) with plotly.js embedded once.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from nopeinterp._io import atomic_write_text
from nopeinterp.errors import NopeinterpError

# The presenting layer, named rather than imported (as pandas names its plotting backend):
# results are data and import no figure code; `figure()` and `save()` hand the result to this
# module's `draw`, `sections` and `write_result_html`.
PRESENTER = "nopeinterp.viz.results"


def presenter():
    """The module that draws results (`PRESENTER`), imported on first use."""
    return importlib.import_module(PRESENTER)


@dataclass(repr=False)
class Result:
    table: pd.DataFrame
    meta: dict = field(default_factory=dict)

    name: ClassVar[str] = "result"  # file stem used by save()
    title: ClassVar[str] = "Result"
    extra_tables: ClassVar[tuple[str, ...]] = ()  # attribute names of further DataFrames

    def draw(self, kind: str = "figure", **options):
        """A plotly Figure of the result, drawn by the presenting layer (see `PRESENTER`)."""
        return presenter().draw(self, kind, **options)

    def figure(self, **options):
        """A plotly Figure of the result (each type has its own; else its table)."""
        return self.draw("figure", **options)

    def tables(self) -> dict[str, pd.DataFrame]:
        """The main table under `self.name`, then each extra table."""
        out = {self.name: self.table}
        for extra in self.extra_tables:
            out[f"{self.name}_{extra}"] = getattr(self, extra)
        return out

    def save(
        self, out_dir: str | os.PathLike, name: str | None = None, *, html: bool = True
    ) -> dict[str, Path]:
        """Write the tables (CSV), meta (JSON) and, unless `html=False`, an offline HTML
        report into `out_dir`."""
        stem = name or self.name
        out = Path(out_dir)
        paths: dict[str, Path] = {}
        for key, df in self.tables().items():
            key = key.replace(self.name, stem, 1)
            paths[key] = atomic_write_text(out / f"{key}.csv", df.to_csv(index=False))
        paths["meta"] = atomic_write_text(
            out / f"{stem}_meta.json", json.dumps(self.meta, indent=2, default=str)
        )
        if not html:
            return paths
        paths["html"] = presenter().write_result_html(out / f"{stem}.html", self)
        return paths

    def __repr__(self) -> str:
        head = self.table.head(10).to_string(index=False, float_format=lambda v: f"{v:.4g}")
        more = f"\n... {len(self.table)} rows" if len(self.table) > 10 else ""
        return f"{type(self).__name__}({self.meta.get('title') or self.title})\n{head}{more}"


# --- attention patterns for the explorer (nopeinterp.similarity.explorer computes them,
# nopeinterp.viz.explorer draws them). Each pattern is stored as its causal lower triangle
# (row t holds keys 0..t), quantised to one byte (round(p * 255)) and base64-encoded.
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
