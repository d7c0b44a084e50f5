"""The one shape every analysis result has (scikit-learn style: results are data).

    result.table          tidy pandas DataFrame (one row per observation)
    result.meta           plain dict (JSON-serialisable settings and counts)
    result.figure()       a plotly Figure drawn from the data alone
    result.save(dir)      {what: Path} of the files written; computes nothing

A result holds data only: no models, no tensors that need a forward pass to use. Subclasses
name their extra tables in `extra_tables` and add their own figure; `save` then writes
`<name>.csv` for the main table, `<name>_<extra>.csv` for each extra, `<name>_meta.json`
and `<name>.html` (figure, tables, settings) with plotly.js embedded once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd


@dataclass(repr=False)
class Result:
    table: pd.DataFrame
    meta: dict = field(default_factory=dict)

    name: ClassVar[str] = "result"  # file stem used by save()
    title: ClassVar[str] = "Result"
    extra_tables: ClassVar[tuple[str, ...]] = ()  # attribute names of further DataFrames

    def figure(self):
        """A plotly Figure of the result (subclasses draw something better than a table)."""
        import plotly.graph_objects as go

        t = self.table
        return go.Figure(
            go.Table(
                header={"values": list(t.columns)},
                cells={"values": [t[c].tolist() for c in t.columns]},
            )
        )

    def tables(self) -> dict[str, pd.DataFrame]:
        """The main table under `self.name`, then each extra table."""
        out = {self.name: self.table}
        for extra in self.extra_tables:
            out[f"{self.name}_{extra}"] = getattr(self, extra)
        return out

    def html_sections(self) -> list:
        """(heading, Figure | DataFrame | html str) sections of the saved HTML report."""
        return [(self.meta.get("title") or self.title, self.figure()), ("Table", self.table)]

    def save(
        self, out_dir: str | os.PathLike, name: str | None = None, *, html: bool = True
    ) -> dict[str, Path]:
        """Write the tables (CSV), meta (JSON) and, unless `html=False`, an offline HTML
        report into `out_dir`."""
        from nopeinterp.viz.html import atomic_write_text, write_report

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
        title = self.meta.get("title") or self.title
        paths["html"] = write_report(out / f"{stem}.html", title, self.html_sections())
        return paths

    def __repr__(self) -> str:
        head = self.table.head(10).to_string(index=False, float_format=lambda v: f"{v:.4g}")
        more = f"\n... {len(self.table)} rows" if len(self.table) > 10 else ""
        return f"{type(self).__name__}({self.meta.get('title') or self.title})\n{head}{more}"
