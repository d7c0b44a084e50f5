"""The analysis scripts (analyses/*.py), end to end with --quick on tiny untrained checkpoints.

The numbers are meaningless (untrained models); this checks that every script runs, writes its
tables (CSV + markdown) and figures (HTML), and that the tables have the documented columns.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from nopeinterp import build_model, save_checkpoint, zoo
from nopeinterp.errors import NopeinterpError
from nopeinterp.tasks import get_task, task_tokenizer
from nopeinterp.viz.export import find_chromium

pytestmark = pytest.mark.tl4

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
TASK_OPTIONS = {
    "copy": {"id_lengths": [2, 3], "ood_lengths": [4, 5]},
    "scan": {"id_lengths": [1, 2], "ood_lengths": [3, 4]},
}
MODELS = {
    "copy": [("nope", "nope", 0), ("nope-seed1", "nope", 1), ("t5", "t5", 0), ("ape", "ape", 0)],
    "scan": [
        ("nope", "nope", 0),
        ("nope-seed1", "nope", 1),
        ("t5", "t5", 0),
        ("alibi", "alibi", 0),
    ],
}


def load_script(name: str):
    sys.path.insert(0, str(ANALYSES))
    spec = importlib.util.spec_from_file_location(f"analyses_{name}", ANALYSES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpts")
    for task_name, models in MODELS.items():
        options = TASK_OPTIONS[task_name]
        tok = task_tokenizer(get_task(task_name, **options))
        for name, pe, seed in models:
            n_ctx = 10 if pe == "ape" else 48  # copy: ID sequences fit in 10 tokens, OOD do not
            model = build_model(pe, n_layers=2, n_heads=2, d_model=16, d_vocab=len(tok),
                                n_ctx=n_ctx, seed=seed, tokenizer=tok)  # fmt: skip
            save_checkpoint(model, directory / f"{task_name}-{name}.pt", task=task_name,
                            task_options=options, seed=seed)  # fmt: skip
    (directory / "notes.pt.state.pt").write_bytes(b"")  # ignored: not <task>-<pe>.pt
    return directory


def run(name, ckpt_dir, out, *extra):
    paths = load_script(name).main(
        ["--checkpoints", str(ckpt_dir), "--quick", "--out", str(out), *extra]
    )
    for p in paths:
        assert Path(p).exists() and Path(p).stat().st_size > 0, p
    return {Path(p).name for p in paths}


def read(out, name):
    csv = pd.read_csv(out / f"{name}.csv")
    md = (out / f"{name}.md").read_text()
    assert md.count("\n|") >= 2 and all(str(c) in md for c in csv.columns)
    return csv


def test_discover(ckpt_dir):
    found = zoo.find_checkpoints(ckpt_dir)
    assert [(c.task, c.pe, c.seed) for c in found][:4] == [
        ("copy", "nope", 0), ("copy", "nope", 1), ("copy", "t5", 0), ("copy", "ape", 0)
    ]  # fmt: skip
    assert {c.task for c in zoo.find_checkpoints(ckpt_dir, ["scan"])} == {"scan"}
    nope, prime = zoo.nope_pair(found, "copy")
    assert (nope.name, prime.name) == ("copy-nope", "copy-nope-seed1")
    assert list(zoo.references(found, "copy")) == ["t5", "ape"]
    assert zoo.analysis_task(found) == "scan"  # the paper's task when it is there


def test_discover_several_folders_first_wins(ckpt_dir, tmp_path):
    extra = tmp_path / "seeds"
    extra.mkdir()
    shutil.copy(ckpt_dir / "copy-nope-seed1.pt", extra / "copy-nope-seed1.pt")  # a repeat
    shutil.copy(ckpt_dir / "copy-t5.pt", extra / "copy-t5-seed2.pt")  # a new seed
    found = zoo.find_checkpoints([ckpt_dir, extra], ["copy"])
    by_name = {c.name: c for c in found}
    assert len(by_name) == len(found)  # no name twice
    assert by_name["copy-nope-seed1"].path.parent == ckpt_dir
    assert (by_name["copy-t5-seed2"].seed, by_name["copy-t5-seed2"].path.parent) == (2, extra)
    with pytest.raises(NopeinterpError, match="no checkpoint directory"):
        zoo.find_checkpoints([ckpt_dir, tmp_path / "missing"])


def test_over_seeds():
    df = pd.DataFrame({"pe": ["a", "a", "a", "b"], "x": [1.0, 2.0, 6.0, 5.0]})
    out = zoo.over_seeds(df, ["pe"], ["x"]).set_index("pe")
    assert out.loc["a"].tolist() == [3.0, 1.0, 6.0, 3] and out.loc["b"].tolist() == [5, 5, 5, 1]
    assert list(out.columns) == ["x_mean", "x_min", "x_max", "n_seeds"]


def test_markdown_formatter():
    common = load_script("_common")
    text = common.to_markdown(pd.DataFrame({"a": ["x|y", "z"], "b": [0.123456, math.nan]}))
    assert text.splitlines() == ["| a | b |", "|---|---:|", "| x\\|y | 0.1235 |", "| z |  |"]


def test_write_section_replaces_inserts_or_appends_one_marked_section(tmp_path):
    common = load_script("_common")
    begin, end = "<!-- s:begin -->", "<!-- s:end -->"
    doc = tmp_path / "REPORT.md"
    doc.write_text("# Part 1\n\ntext\n\n# Part 2\n\nmore\n")
    common.write_section(doc, f"{begin}\nfirst\n{end}\n", begin, end, before="# Part 2")
    assert doc.read_text() == f"# Part 1\n\ntext\n\n{begin}\nfirst\n{end}\n\n# Part 2\n\nmore\n"
    common.write_section(doc, f"{begin}\nsecond\nlines\n{end}", begin, end, before="# Part 2")
    assert doc.read_text() == (
        f"# Part 1\n\ntext\n\n{begin}\nsecond\nlines\n{end}\n\n# Part 2\n\nmore\n"
    )  # replaced in place, once, the rest unchanged
    other = ("<!-- o:begin -->", "<!-- o:end -->")
    common.write_section(doc, f"{other[0]}\nx\n{other[1]}", *other, before="# Part 9")
    assert doc.read_text().endswith(f"more\n\n{other[0]}\nx\n{other[1]}\n")  # no anchor: at the end
    before = doc.read_text()
    with pytest.raises(ValueError, match="starts with"):
        common.write_section(doc, "no markers", begin, end)
    assert doc.read_text() == before


def test_mrr_ranks_ties_and_incomplete_splits():
    mod = load_script("length_generalization")
    rows = [  # per-length rows; copy seed 1 has only NoPE and must not count
        ("copy", 0, "nope", 9, True), ("copy", 0, "t5", 5, True),
        ("copy", 0, "ape", 0, False), ("copy", 0, "ape", 0, False),  # cannot read: wrong
        ("scan", 0, "nope", 2, True), ("scan", 0, "t5", 2, True), ("copy", 1, "nope", 0, True),
        ("copy", 0, "nope", 10, True, "ID"),  # ID rows do not enter the ranking
    ]  # fmt: skip
    table = pd.DataFrame(
        [
            dict(
                task=t,
                seed=s,
                pe=p,
                model=f"{t}-{p}-{s}",
                split=(rest or ["OOD"])[0],
                n=10,
                correct=c,
                evaluable=e,
            )
            for t, s, p, c, e, *rest in rows
        ]  # fmt: skip
    )
    ood = mod.ood_accuracy(table)
    assert ood.set_index("model").ood_accuracy.to_dict() == {
        "copy-nope-0": 0.9, "copy-t5-0": 0.5, "copy-ape-0": 0.0, "scan-nope-0": 0.2,
        "scan-t5-0": 0.2, "copy-nope-1": 0.0,
    }  # fmt: skip
    ranks, mrr = mod.mean_reciprocal_rank(ood)
    assert len(ranks) == 5
    got = dict(zip(mrr.pe, mrr.mrr, strict=True))
    assert got["nope"] == pytest.approx((1 + 1 / 1.5) / 2)  # rank 1 on copy, tied 1.5 on scan
    assert got["t5"] == pytest.approx((1 / 2 + 1 / 1.5) / 2)
    assert got["ape"] == pytest.approx(1 / 3)  # not evaluable = wrong, last
    assert dict(zip(mrr.pe, mrr.n_splits, strict=True)) == {"nope": 2, "t5": 2, "ape": 1}
    # ranking among a subset re-ranks: without ape, t5 is 2nd of 2 on copy
    _, sub = mod.mean_reciprocal_rank(ood, pes=("nope", "t5"))
    assert set(sub.pe) == {"nope", "t5"}
    assert dict(zip(sub.pe, sub.mrr, strict=True))["t5"] == pytest.approx((1 / 2 + 1 / 1.5) / 2)


def test_length_generalization(ckpt_dir, tmp_path, capsys):
    names = run("length_generalization", ckpt_dir, tmp_path, "--n", "3")
    assert {"length_generalization.md", "length_generalization.html"} <= names
    assert "Mean reciprocal rank" in capsys.readouterr().out
    wide = read(tmp_path, "length_generalization")
    assert list(wide.columns) == ["task", "model", "pe", "seed", "ID", "OOD"]
    assert len(wide) == 8
    per_length = read(tmp_path, "length_generalization_by_length")
    assert {"model", "pe", "task", "length", "split", "accuracy", "evaluable", "seed"} <= set(
        per_length
    )
    assert not per_length.loc[
        (per_length.model == "copy-ape") & (per_length.split == "OOD"), "evaluable"
    ].any()
    mrr = read(tmp_path, "length_generalization_mrr")
    assert list(mrr.columns) == ["pe", "mrr", "n_splits", "paper_mrr", "among"]
    assert set(mrr.pe[mrr.among == "all"]) == {"nope", "t5", "ape", "alibi"}
    assert set(mrr.pe[mrr.among == "paper"]) == {"nope", "t5", "alibi"}
    assert mrr.mrr.between(0, 1).all()
    by_pe = read(tmp_path, "length_generalization_seeds")
    assert list(by_pe.columns) == ["task", "pe", "ID_mean", "ID_min", "ID_max", "OOD_mean",
                                   "OOD_min", "OOD_max", "n_seeds"]  # fmt: skip
    assert by_pe.set_index(["task", "pe"]).n_seeds[("copy", "nope")] == 2  # seeds 0 and 1
    ranks = read(tmp_path, "length_generalization_ranks")
    assert set(ranks.seed) == {0}  # the NoPE-prime seed is no split of its own


def test_position_probes(ckpt_dir, tmp_path):
    names = run("position_probes", ckpt_dir, tmp_path, "--tasks", "copy")
    assert "position_probes.html" in names
    if find_chromium() is not None:  # the PNG beside the HTML, at the figure's own size x 2
        import plotly.graph_objects as go
        from test_export import _png_size

        data = (tmp_path / "position_probes.png").read_bytes()
        layout = go.Figure(
            load_script("position_probes").figure(read(tmp_path, "position_probes"))
        ).layout
        assert _png_size(data) == (2 * (layout.width or 900), 2 * (layout.height or 500))
        assert 20_000 < len(data) < 5_000_000  # a drawn multi-panel figure, not a blank image
    table = read(tmp_path, "position_probes")
    assert list(table.columns) == ["checkpoint", "task", "pe", "seed", "model", "layer",
                                   "layer_pe", "hook", "hook_name", "split", "metric", "value",
                                   "n", "degenerate"]  # fmt: skip
    assert set(table.checkpoint) == {"copy-nope", "copy-nope-seed1", "copy-t5", "copy-ape"}
    assert {"trained", "random_init"} <= set(table.model)
    assert set(table.layer) == {0, 1, 2}
    pivot = read(tmp_path, "position_probes_pivot")
    assert {"checkpoint", "pe", "layer", "ID r2", "ID mae", "ID r2 [random_init]"} <= set(pivot)
    by_pe = read(tmp_path, "position_probes_seeds")
    nope = by_pe[(by_pe.pe == "nope") & (by_pe.layer == 1)].iloc[0]
    assert nope.n_seeds == 2  # copy-nope and copy-nope-seed1
    rows = pivot[(pivot.pe == "nope") & (pivot.layer == 1)]["OOD r2"]
    assert nope["OOD r2_mean"] == pytest.approx(rows.mean())
    assert (nope["OOD r2_min"], nope["OOD r2_max"]) == pytest.approx((rows.min(), rows.max()))


def test_distance_dependence(ckpt_dir, tmp_path):
    names = run("distance_dependence", ckpt_dir, tmp_path, "--tasks", "scan")
    assert {"distance_dependence.html", "attention_distance_histogram.html"} <= names
    wide = read(tmp_path, "distance_dependence")
    assert list(wide.columns) == ["checkpoint", "task", "pe", "seed", "split", "layer",
                                  "head 0", "head 1", "mean", "max"]  # fmt: skip
    assert set(wide.split) == {"ID", "OOD"}
    bands = read(tmp_path, "attention_distance_bands")
    assert {"near", "middle", "far", "near_uniform", "far_uniform"} <= set(bands)
    total = bands[["near", "middle", "far"]].sum(axis=1)
    assert total.to_numpy() == pytest.approx(1.0, abs=1e-6)  # the histogram sums to 1
    assert bands[["near_uniform", "far_uniform"]].gt(0).all().all()
    per_head = read(tmp_path, "attention_distance_bands_per_head")
    assert {"head", "near", "far", "bimodal"} <= set(per_head)
    counts = per_head.groupby(["checkpoint", "split", "layer"]).bimodal.sum()
    assert bands.set_index(
        ["checkpoint", "split", "layer"]
    ).bimodal_heads.sort_index().tolist() == (counts.sort_index().tolist())
    hist = read(tmp_path, "attention_distance_histogram")
    assert {"checkpoint", "pe", "split", "layer", "head", "distance", "mass"} <= set(hist)
    by_pe = read(tmp_path, "distance_dependence_seeds")
    assert {"score_mean_heads_mean", "score_max_heads_max", "near_mean", "far_max",
            "bimodal_heads_mean", "n_seeds"} <= set(by_pe)  # fmt: skip
    assert by_pe.set_index(["pe", "split", "layer"]).n_seeds[("nope", "ID", 0)] == 2
    rel = read(tmp_path, "attention_relative_distance_histogram")
    assert {"checkpoint", "split", "layer", "head", "rel_lo", "rel_hi", "mass", "uniform"} <= set(
        rel
    )
    assert "attention_relative_distance_histogram.html" in names


def test_attention_similarity(ckpt_dir, tmp_path, capsys):
    names = run("attention_similarity", ckpt_dir, tmp_path, "--n-boot", "50")
    assert {"attention_similarity_jsd.html", "attention_similarity_paper_jsd.html"} <= names
    assert "ranked by true JSD" in capsys.readouterr().out
    table = read(tmp_path, "attention_similarity")
    assert list(table.columns[:4]) == ["ref", "layer", "split", "n"]
    for stat in ("mean", "ci_low", "ci_high"):
        assert {f"jsd_{stat}", f"paper_jsd_{stat}"} <= set(table)
    assert set(table.ref) == {"t5", "alibi", "nope_prime"}
    assert set(table.layer.astype(str)) == {"0", "1", "all"}
    assert (table.jsd_mean <= math.log(2) + 1e-9).all()  # the true JSD is bounded by ln 2
    ranking = read(tmp_path, "attention_similarity_ranking")
    assert {"split", "jsd_rank", "ref", "jsd_mean", "paper_jsd_rank", "paper_reported"} <= set(
        ranking
    )
    assert not (tmp_path / "attention_similarity_seeds.csv").exists()  # one seed of t5/alibi


def test_attention_similarity_across_seeds(ckpt_dir, tmp_path):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for pe, seed in [("nope", 2), ("t5", 1), ("alibi", 1), ("t5", 2), ("alibi", 2)]:
        source = ckpt_dir / f"scan-{pe}.pt"  # the same weights under another seed's name
        shutil.copy(source, seeds / f"scan-{pe}-seed{seed}.pt")
    out = tmp_path / "out"
    paths = load_script("attention_similarity").main(
        ["--checkpoints", str(ckpt_dir), str(seeds), "--quick", "--out", str(out),
         "--n-boot", "20"]
    )  # fmt: skip
    assert out / "attention_similarity_seed_summary.csv" in paths
    per_seed = read(out, "attention_similarity_seeds")
    assert set(per_seed.seed) == {0, 1, 2}
    assert dict(zip(per_seed.seed, per_seed.nope_prime_seed, strict=False)) == {0: 1, 1: 2, 2: 0}
    summary = read(out, "attention_similarity_seed_summary")
    assert set(summary.ref) == {"t5", "alibi", "nope_prime"} and (summary.n_seeds == 3).all()
    assert (summary.jsd_min <= summary.jsd_mean_over_seeds + 1e-12).all()
    assert (summary.jsd_mean_over_seeds <= summary.jsd_max + 1e-12).all()
    # seed 2's NoPE has seed 0's weights and is compared with NoPE seed 0 as its NoPE-prime
    s2 = per_seed[(per_seed.seed == 2) & (per_seed.ref == "nope_prime")]
    assert s2["mean"].abs().max() < 1e-9


def test_attention_similarity_cross_seeds_take_every_reference_from_the_next_seed(
    ckpt_dir, tmp_path
):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    # "t5 seed 1" is NoPE seed 0's model: only the cross-seed ranking of seed 0 compares them
    shutil.copy(ckpt_dir / "scan-nope.pt", seeds / "scan-t5-seed1.pt")
    shutil.copy(ckpt_dir / "scan-alibi.pt", seeds / "scan-alibi-seed1.pt")
    infos = {i.name: i for i in zoo.find_checkpoints([ckpt_dir, seeds], ["scan"])}
    script = load_script("attention_similarity")
    common = {"n_per_length": 1, "n_boot": 10, "progress": False}
    same = script.across_seeds(infos, "scan", common, refs_seed="same")
    cross = script.across_seeds(infos, "scan", common, refs_seed="next")
    assert (same.ref_seed == same.seed).all()
    assert (cross.ref_seed == cross.nope_prime_seed).all() and set(cross.seed) == {0, 1}
    t5 = {(r.seed, r.split): r.mean for r in cross[cross.ref == "t5"].itertuples()}
    assert t5[(0, "ID")] < 1e-9 and t5[(0, "OOD")] < 1e-9  # NoPE 0 against its own copy
    assert min(same[same.ref == "t5"]["mean"]) > 1e-3  # never its own copy at the same seed
    with pytest.raises(ValueError, match="same.*next"):
        script.across_seeds(infos, "scan", common, refs_seed="other")


def test_write_figure_without_a_browser_says_why_once_and_keeps_the_html(
    tmp_path, monkeypatch, capsys
):
    import plotly.graph_objects as go

    common = load_script("_common")
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium"))
    fig = go.Figure(go.Bar(y=[1, 2]))
    (tmp_path / "a.png").write_bytes(b"an earlier run's figure")
    (tmp_path / "b.png").write_bytes(b"an earlier run's figure")
    first = common.write_figure(fig, tmp_path, "a")
    second = common.write_figure(fig, tmp_path, "b")
    assert [p.name for p in first + second] == ["a.html", "b.html"]
    printed = capsys.readouterr().out
    assert printed.count("note: no PNG figures") == 1 and "needs Chromium" in printed
    assert not list(tmp_path.glob("*.png"))  # stale figures do not stay beside new HTML


def test_causal_position(ckpt_dir, tmp_path, capsys):
    names = run("causal_position", ckpt_dir, tmp_path, "--tasks", "copy", "--jobs", "2")
    assert {"causal_erasure.html", "causal_sinks.html", "causal_heads.html"} <= names
    assert "Position erasure" in capsys.readouterr().out
    tidy = read(tmp_path, "causal_erasure")
    assert set(tidy.checkpoint) == {"copy-nope", "copy-nope-seed1", "copy-t5", "copy-ape"}
    assert set(tidy.condition) == {"none", "leace", "random"}
    assert {"r2", "exact_match", "target_loss"} <= set(tidy.metric)
    summary = read(tmp_path, "causal_erasure_summary")
    assert set(summary.layer) == {0, 1, 2}  # embeddings and after each of the 2 blocks
    # the summary's deltas are the tidy table's (erased minus unerased), not recomputed
    row = summary[(summary.checkpoint == "copy-t5") & (summary.layer == 1)].iloc[0]
    t = tidy[(tidy.checkpoint == "copy-t5") & (tidy.layer == 1) & (tidy.split == "ID")]
    t = t.set_index(["condition", "metric"])
    assert row["ID exact_match d_leace"] == pytest.approx(
        t.value[("leace", "exact_match")] - t.value[("none", "exact_match")]
    )
    assert row["ID r2 leace"] == pytest.approx(t.value[("leace", "r2")])
    # the learned-APE model cannot read OOD copy sequences: no OOD rows for it
    assert "OOD" not in set(tidy[tidy.checkpoint == "copy-ape"].split)
    by_pe = read(tmp_path, "causal_erasure_seeds")
    nope = by_pe[(by_pe.pe == "nope") & (by_pe.layer == 1)].iloc[0]
    assert nope.n_seeds == 2
    two = summary[(summary.pe == "nope") & (summary.layer == 1)]["ID r2 leace"]
    assert nope["ID r2 leace_mean"] == pytest.approx(two.mean())
    heads = read(tmp_path, "causal_heads")
    assert len(heads[(heads.checkpoint == "copy-t5") & (heads.split == "ID")]) == 2 * 2
    counts = read(tmp_path, "causal_heads_counts")
    id_counts = counts[counts.split == "ID"].set_index("checkpoint")
    kinds = ["sink", "previous_token", "local", "uniform", "distance", "content"]
    assert (id_counts[kinds].sum(axis=1) == 4).all()  # every head has exactly one label
    sinks = read(tmp_path, "causal_sinks")
    assert ((sinks.first_mass > 0) & (sinks.first_mass <= 1)).all()
    read(tmp_path, "causal_sinks_by_layer")


@pytest.mark.parametrize(
    "script, args, message",
    [
        (
            "checkpoint_table",
            ["--checkpoints", "{tmp}"],
            "error: {tmp}: no checkpoints (*.pt, *.safetensors) in this directory",
        ),  # fmt: skip
        (
            "lm_study",
            ["measure-again", "lm-nosuch-seed9"],
            "error: no committed record for lm-nosuch-seed9",
        ),  # fmt: skip
    ],
)
def test_a_bad_input_is_one_line_and_exit_2(script, args, message, tmp_path):
    """Every script runs its main through _common.run_script: a NopeinterpError is one line on
    stderr and exit status 2, no traceback, nothing written."""
    import subprocess

    before = sorted(tmp_path.iterdir())
    fill = {"tmp": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ANALYSES / f"{script}.py"), *[a.format(**fill) for a in args]],
        capture_output=True,
        text=True,
        cwd=ANALYSES.parent,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == message.format(**fill)
    assert sorted(tmp_path.iterdir()) == before


def test_every_script_exits_through_run_script():
    """The one rule for a script's exit (run_script): no script catches errors on its own."""
    for path in sorted(ANALYSES.glob("*.py")):
        if path.name.startswith("_"):
            continue
        text = path.read_text()
        assert text.rstrip().endswith("run_script(main)"), path.name
        assert "return 2" not in text and "exit(2)" not in text, path.name
