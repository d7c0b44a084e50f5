"""Issue 16 phase 2: the `repro` preset, validation on `Task.eval_set("val")`, sweep records
scored on `Task.eval_set("test")` (or no test at all during the LR search), and the driver."""

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from nopeinterp import load_checkpoint
from nopeinterp.errors import NopeinterpError
from nopeinterp.evaluation import evaluate
from nopeinterp.paper import FIVE_PES as PAPER_FIVE
from nopeinterp.tasks import PAPER_SPLITS, get_task
from nopeinterp.training import make_config
from nopeinterp.training.sweep import RECORD, run_sweep
from nopeinterp.training.trainer import TrainConfig, _lock, validation_examples

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("reproduction", ROOT / "analyses/reproduction.py")
repro = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repro)

# a few steps of a tiny model on short copy lengths (cmc, the 100 paper symbols)
SMALL = {
    "val_set": "eval_set",
    "eval_n": 2,
    "steps": 4,
    "eval_every": 2,
    "task_options": {"id_lengths": [2, 4], "ood_lengths": [5, 6]},
}


def test_repro_preset_is_the_protocols_table(tmp_path):
    cfg = make_config("copy", "nope", tmp_path / "m.pt", preset="repro", lr=3e-4)
    expected = dict(
        n_layers=4, n_heads=8, d_model=128, d_mlp=512, attn_scale=False, dropout=0.1,
        weight_decay=0.05, warmup=0.06, steps=1500, batch_size=64, eval_every=150, eval_n=25,
        val_set="eval_set", lr=3e-4,
    )  # fmt: skip
    assert {k: getattr(cfg, k) for k in expected} == expected
    # the reference preset (the shipped checkpoints) keeps the old sampled validation
    ref = make_config("copy", "nope", tmp_path / "m.pt", preset="reference")
    assert ref.val_set == "sampled"
    assert TrainConfig(task="copy", pe="nope", out=str(tmp_path / "m.pt")).val_set == "sampled"


def test_bad_val_set_is_refused(tmp_path):
    with pytest.raises(NopeinterpError, match="val_set"):
        TrainConfig(task="copy", pe="nope", out=str(tmp_path / "m.pt"), val_set="all")


def test_validation_examples_follow_val_set(tmp_path):
    task = get_task("copy", variant="rsc")
    cfg = make_config("copy", "nope", tmp_path / "m.pt", preset="repro")
    items = validation_examples(task, cfg)
    assert items == task.eval_set("val", n_per_length=25)
    keys = [(e.prompt, e.target) for e in items]
    assert len(keys) == len(set(keys))  # each held-out item once
    assert all(task.held_out(e) for e in items)
    old = validation_examples(task, make_config("copy", "nope", tmp_path / "m.pt", eval_n=30))
    assert len(old) == 30  # the sampled path: eval_n draws


def test_evaluate_n_none_scores_each_test_item_once():
    from nopeinterp.data import task_examples

    task = get_task("copy", variant="rsc2x", id_lengths=(2, 4), ood_lengths=(5, 6))
    split, items = task_examples(task, 5, None)
    assert split == "OOD"
    assert items == task.eval_set("test", lengths=[5])
    assert len(items) == len({e.prompt for e in items}) == 100  # one per symbol


def test_sweep_search_then_grid_adds_the_test_set(tmp_path):
    grid = dict(tasks=["copy:variant=cmc"], pes=["nope"], seeds=[0], out=tmp_path)
    assert run_sweep(**grid, preset="tiny", overrides=SMALL, test="none") == {
        "copy.variant=cmc-nope-seed0": "finished"
    }
    path = tmp_path / "copy.variant=cmc-nope-seed0" / RECORD
    record = json.loads(path.read_text())
    assert record["test"] == "none" and record["ood_accuracy"] is None
    assert record["accuracy"] == [] and record["test_items"] is None
    assert record["split"] == "cmc" and record["steps"] == 4 and record["lr"] == 3e-3
    task = get_task("copy", variant="cmc", id_lengths=(2, 4), ood_lengths=(5, 6))
    assert record["val_items"] == len(task.eval_set("val", n_per_length=2)) == 6
    assert 0 <= record["val_accuracy"] <= 1 and record["best_step"] in (2, 4)
    history = record["val_history"]  # every evaluation up to the best one
    assert [h["step"] for h in history] == list(range(2, record["best_step"] + 1, 2))
    assert history[-1]["val_accuracy"] == record["val_accuracy"]
    curve = record["val_curve"]  # every evaluation to the end
    assert [h["step"] for h in curve] == [2, 4] and curve[: len(history)] == history
    assert record["steps_run"] == 4 and record["stopped_early"] is False

    assert run_sweep(**grid, preset="tiny", overrides=SMALL, test="eval_set") == {
        "copy.variant=cmc-nope-seed0": "tested"
    }
    record = json.loads(path.read_text())
    test = task.eval_set("test")
    assert record["test"] == "eval_set" and record["test_items"] == len(test) == 200
    # the same numbers as evaluate on the task's eval set, computed independently here
    table = evaluate(load_checkpoint(path.with_name("model.pt")), task, n=None, lengths=[5, 6])
    assert [r["correct"] for r in record["accuracy"]] == table.table["correct"].tolist()
    assert record["ood_accuracy"] == table.table["correct"].sum() / 200
    # a third call changes nothing
    assert run_sweep(**grid, preset="tiny", overrides=SMALL, test="eval_set") == {
        "copy.variant=cmc-nope-seed0": "skipped"
    }


def test_driver_specs_and_lr_choice():
    assert repro.task_spec("rsc") == "copy:variant=rsc"
    assert repro.task_spec("len") == "scan:variant=len"
    for name in PAPER_SPLITS:  # each spec builds the split's task
        from nopeinterp.training.sweep import parse_task_spec

        task, options = parse_task_spec(repro.task_spec(name))
        assert get_task(task, **options).name == PAPER_SPLITS[name].task().name

    def runs(means):
        rows = [
            {"lr": lr, "split": s, "pe": pe, "seed": 0, "val_accuracy": m}
            for lr, m in means.items()
            for s in repro.SEARCH_SPLITS
            for pe in repro.FIVE_PES
        ]
        return pd.DataFrame(rows)

    # the highest mean wins unless a smaller rate is within 0.01 of it
    assert repro.search_summary(runs({3e-4: 0.5, 1e-3: 0.9, 3e-3: 0.8}))[1] == 1e-3
    assert repro.search_summary(runs({3e-4: 0.905, 1e-3: 0.9, 3e-3: 0.91}))[1] == 3e-4
    assert repro.search_summary(runs({3e-4: 0.85, 1e-3: 0.9, 3e-3: 0.91}))[1] == 1e-3
    assert repro.search_summary(runs({3e-4: 0.5, 1e-3: 0.85, 3e-3: 0.9}))[1] == 3e-3
    partial = runs({3e-4: 0.5, 1e-3: 0.9, 3e-3: 0.8}).iloc[:-1]
    assert repro.search_summary(partial)[1] is None  # 29 of 30 runs: no choice


def test_search_restores_committed_records_on_a_new_machine(tmp_path, monkeypatch):
    """An empty runs/ (a new machine): committed search records go back into their run
    folders, so the sweep skips those runs instead of training them again."""
    records, runs = tmp_path / "records", tmp_path / "runs"
    monkeypatch.setattr(repro, "RECORDS", records)
    monkeypatch.setattr(repro, "RUNS", runs)
    folder = records / repro.lr_folder(1e-3)
    folder.mkdir(parents=True)
    (folder / "copy.variant=cmc-nope-seed0.json").write_text('{"val_accuracy": 0.5}')
    (folder / "copy.variant=rsc-nope-seed0.json").write_text("{}")  # not a search split
    assert repro.restore_search_records(1e-3) == ["copy.variant=cmc-nope-seed0"]
    restored = runs / "lr=0.001" / "copy.variant=cmc-nope-seed0" / RECORD
    assert json.loads(restored.read_text()) == {"val_accuracy": 0.5}
    assert not (runs / "lr=0.001" / "copy.variant=rsc-nope-seed0").exists()
    assert repro.restore_search_records(1e-3) == []  # a folder with a record is left alone


def test_analyse_runs_the_analyses_on_finished_grid_runs(tmp_path, monkeypatch):
    """`analyse` links the finished runs of a split under the zoo's names and runs the three
    analysis scripts on them; here on `len`, SCAN without any start token."""
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    runs, records = tmp_path / "runs", tmp_path / "records"
    monkeypatch.setattr(repro, "RUNS", runs)
    monkeypatch.setattr(repro, "RECORDS", records)
    monkeypatch.setattr(repro, "FIVE_PES", ("nope", "t5"))
    monkeypatch.setattr(repro, "SEEDS", (0, 1))
    tiny = {**SMALL, "task_options": {}}
    out = runs / repro.lr_folder(1e-3)
    assert run_sweep(
        [repro.task_spec("len")], ["nope", "t5"], [0], out, preset="tiny", overrides=tiny,
        test="none",
    ) == {"scan.variant=len-nope-seed0": "finished", "scan.variant=len-t5-seed0": "finished"}  # fmt: skip

    folder, missing = repro.zoo_folder(1e-3, "len")
    assert sorted(p.name for p in folder.glob("*.pt")) == ["scan-nope.pt", "scan-t5.pt"]
    assert missing == ["scan.variant=len-nope-seed1", "scan.variant=len-t5-seed1"]
    assert load_checkpoint(folder / "scan-nope.pt").meta["task_options"] == {"variant": "len"}

    repro.analyse(1e-3, ["len"], quick=True)
    written = records / "analyses" / "lr=0.001" / "len"
    probes = pd.read_csv(written / "position_probes.csv")
    assert set(probes["pe"]) == {"nope", "t5"} and set(probes["task"]) == {"scan"}
    assert set(pd.read_csv(written / "distance_dependence.csv")["pe"]) == {"nope", "t5"}
    assert "t5" in set(pd.read_csv(written / "attention_similarity.csv")["ref"])
    with pytest.raises(NopeinterpError, match="unknown split"):
        repro.analyse(1e-3, ["nosuch"])


def test_errors_sorts_the_wrong_test_answers_of_the_tested_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    runs, records = tmp_path / "runs", tmp_path / "records"
    monkeypatch.setattr(repro, "RUNS", runs)
    monkeypatch.setattr(repro, "RECORDS", records)
    monkeypatch.setattr(repro, "FIVE_PES", ("nope", "t5"))
    monkeypatch.setattr(repro, "SEEDS", (0,))
    out = runs / repro.lr_folder(1e-3)
    run_sweep([repro.task_spec("rsc")], ["nope", "t5"], [0], out, preset="tiny", overrides=SMALL,
              test="eval_set")  # fmt: skip
    (records / "lr=0.001").mkdir(parents=True)
    for run in ("copy.variant=rsc-nope-seed0", "copy.variant=rsc-t5-seed0"):  # as `grid` does
        shutil.copyfile(out / run / RECORD, records / "lr=0.001" / f"{run}.json")
    with pytest.raises(NopeinterpError, match="no tested run"):
        repro.error_kinds(1e-3, ["cmc"])
    repro.error_kinds(1e-3, ["rsc"])
    got = pd.read_csv(records / "analyses" / "lr=0.001" / "error_kinds_runs.csv")
    assert list(got["pe"]) == ["nope", "t5"] and got["matches_record"].all()
    kinds = ["correct", "too short", "too long", "wrong words"]
    assert got[kinds].sum(axis=1).to_numpy() == pytest.approx(1.0)
    for row in got.itertuples():
        rec = json.loads((out / f"copy.variant=rsc-{row.pe}-seed0" / RECORD).read_text())
        assert row.correct == pytest.approx(rec["ood_accuracy"])
    # incremental: a second call decodes nothing and keeps every row
    (out / "copy.variant=rsc-t5-seed0" / repro.CHECKPOINT).rename(tmp_path / "gone.pt")
    repro.error_kinds(1e-3, ["rsc"])
    assert "0 runs decoded, 2 kept" in capsys.readouterr().out
    again = pd.read_csv(records / "analyses" / "lr=0.001" / "error_kinds_runs.csv")
    pd.testing.assert_frame_equal(again, got)
    with pytest.raises(NopeinterpError, match="unknown split"):
        repro.error_kinds(1e-3, ["nosuch"])


def test_table_writes_the_comparison_from_committed_records(tmp_path, monkeypatch, capsys):
    """Records made from the paper's own runs (seeds renamed 0, 1, 2) at one rate: the tables
    written must give both sides the same numbers, incomplete cells stay out, and len is in the
    per-split table but not in the MRR. rsc2x has tied cells (the sensitivity view differs)."""
    from nopeinterp.paper import mean_reciprocal_rank, paper_runs

    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    records = tmp_path / "records"
    monkeypatch.setattr(repro, "RECORDS", records)
    seed_of = {s: i for i, s in enumerate(sorted(paper_runs()["seed"].unique()))}
    paper = paper_runs()[paper_runs()["split"].isin(["cmc", "mdlen", "len", "rsc2x"])].copy()
    paper["seed"] = paper["seed"].map(seed_of)
    folder = records / "lr=0.001"
    folder.mkdir(parents=True)
    for r in paper.itertuples():
        if (r.split, r.pe, r.seed) == ("mdlen", "t5", 2):
            continue  # an unfinished run: the cell (mdlen, seed 2) is incomplete
        rec = {"lr": 1e-3, "split": r.split, "pe": r.pe, "seed": r.seed, "steps": 1500,
               "ood_accuracy": r.ood_accuracy, "val_accuracy": 0.95, "best_step": 1500,
               "test_items": 100, "val_items": 50, "run_wall_s": 360.0}  # fmt: skip
        (folder / f"{r.split}-{r.pe}-seed{r.seed}.json").write_text(json.dumps(rec))
    paths = repro.table(1e-3, tmp_path / "tables")
    assert "chosen rate: not yet" in capsys.readouterr().out
    written = tmp_path / "tables" / "lr=0.001"
    runs = pd.read_csv(written / "runs.csv")
    assert len(runs) == 150 and (runs["status"] == "done").sum() == 59
    table = pd.read_csv(written / "paper_comparison.csv")
    assert set(table["split"]) == {"cmc", "mdlen", "len", "rsc2x"}
    whole = table[table["split"] != "mdlen"]
    assert whole["mean_ours"].to_numpy() == pytest.approx(whole["mean_paper"].to_numpy())
    assert table.loc[table["split"] == "mdlen", "n_seeds_ours"].eq(2).all()  # seed 2 left out
    mrr = pd.read_csv(written / "paper_comparison_mrr.csv")
    assert set(mrr["n_splits"]) == {3}  # cmc, mdlen and rsc2x; len is left out of the MRR
    assert (mrr.loc[mrr["side"] == "ours", "n_cells"] == 8).all()
    assert {p.name for p in paths} >= {"paper_comparison_agreement.md", "lr_search.csv"}
    # the sensitivity view: ties share their average rank, on the same cells as the MRR
    averaged = pd.read_csv(written / "paper_comparison_mrr_ties_averaged.csv")
    splits = ["cmc", "mdlen", "rsc2x"]
    expected = mean_reciprocal_rank(paper_runs(), splits=splits, tie_order=None)
    got = averaged[averaged["side"] == "paper"]
    assert got["mrr"].to_numpy() == pytest.approx(expected["mrr"].to_numpy())
    primary = mrr[mrr["side"] == "paper"]["mrr"].to_numpy()
    assert got["mrr"].to_numpy() != pytest.approx(primary)  # rsc2x's ties are ranked otherwise
    assert (averaged.loc[averaged["side"] == "ours", "n_cells"] == 8).all()


def test_accuracy_by_length_averages_the_tested_seeds_of_one_rate(tmp_path, monkeypatch):
    folder = tmp_path / "lr=0.001"
    folder.mkdir()

    def record(name, lr, split, pe, seed, accs, tested=True):
        rec = {"lr": lr, "split": split, "pe": pe, "seed": seed, "steps": 10, "best_step": 10,
               "val_accuracy": 0.5, "ood_accuracy": sum(accs) / len(accs) if tested else None,
               "accuracy": [{"split": "OOD", "length": 21 + i, "accuracy": a, "evaluable": True,
                             "n": 100, "correct": round(100 * a)} for i, a in enumerate(accs)]}  # fmt: skip
        (folder / f"{name}.json").write_text(json.dumps(rec))

    record("a", 1e-3, "rsc", "t5", 0, [0.2, 0.4])
    record("b", 1e-3, "rsc", "t5", 1, [0.6, 0.0])
    record("c", 1e-3, "cmc", "nope", 0, [0.1, 0.3])
    record("d", 3e-4, "rsc", "t5", 2, [1.0, 1.0])  # another rate
    record("e", 1e-3, "rsc", "t5", 2, [1.0, 1.0], tested=False)  # a search run: no test
    got = repro.accuracy_by_length(1e-3, tmp_path)
    assert list(got["split"]) == ["cmc", "cmc", "rsc", "rsc"]  # PAPER_SPLITS order
    rsc = got[got["split"] == "rsc"]
    assert rsc["mean"].to_numpy() == pytest.approx([0.4, 0.2])
    assert rsc["min"].to_numpy() == pytest.approx([0.2, 0.0])
    assert rsc["max"].to_numpy() == pytest.approx([0.6, 0.4])
    assert list(rsc["n_seeds"]) == [2, 2] and list(rsc["length"]) == [21, 22]
    assert set(got["test_split"]) == {"OOD"}
    assert repro.accuracy_by_length(1e-2, tmp_path).empty
    # written as a table and one figure per task present (copy here: cmc and rsc)
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    monkeypatch.setattr(repro, "RECORDS", tmp_path)
    names = {p.name for p in repro.length_tables(1e-3, tmp_path / "out")}
    assert {"accuracy_by_length.csv", "accuracy_by_length_copy.html"} <= names
    assert not any("reverse" in n or "scan" in n for n in names)
    assert repro.length_tables(1e-2, tmp_path / "none") == []


def test_grid_order_runs_the_analysed_splits_first_and_every_split_once():
    order = repro.grid_order()
    assert order[:2] == ["mdlen", "len"] and sorted(order) == sorted(PAPER_SPLITS)


def test_grid_part_runs_only_the_asked_splits_and_seeds_in_protocol_order(tmp_path, monkeypatch):
    monkeypatch.setattr(repro, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(repro, "RUNS", tmp_path / "runs")
    calls = []
    monkeypatch.setattr(repro, "_sweep", lambda splits, seeds, *a: calls.append((splits, seeds)))
    repro.run_grid(1e-3, splits=["len", "cmc", "mdlen"], seeds=[2, 1])
    assert calls == [(["mdlen", "len", "cmc"], [1]), (["mdlen", "len", "cmc"], [2])]
    calls.clear()
    repro.run_grid(1e-3)
    assert calls == [(repro.grid_order(), [seed]) for seed in repro.SEEDS]


def test_grid_on_a_new_machine_restores_tested_records_and_retrains_the_rest(tmp_path, monkeypatch):
    records, runs = tmp_path / "records", tmp_path / "runs"
    monkeypatch.setattr(repro, "RECORDS", records)
    monkeypatch.setattr(repro, "RUNS", runs)
    folder = records / repro.lr_folder(1e-3)
    folder.mkdir(parents=True)
    tested, untested = "copy.variant=rsc-nope-seed1", "copy.variant=cmc-t5-seed0"
    (folder / f"{tested}.json").write_text('{"test": "eval_set", "ood_accuracy": 0.5}')
    (folder / f"{untested}.json").write_text('{"test": "none", "ood_accuracy": null}')
    (folder / "other-run.json").write_text('{"test": "eval_set"}')  # not a grid run
    # the search restored its record earlier on this machine, but the checkpoint is elsewhere
    assert repro.restore_search_records(1e-3) == [untested]
    restored, retrain = repro.prepare_grid_folder(1e-3)
    assert restored == [tested] and retrain == [untested]
    here = runs / "lr=0.001"
    assert json.loads((here / tested / RECORD).read_text())["ood_accuracy"] == 0.5
    assert not (here / untested / RECORD).exists() and not (here / "other-run").exists()
    # with the checkpoint present the search record stays: the grid adds the test set to it
    (here / untested / RECORD).write_text('{"test": "none"}')
    (here / untested / "model.pt").write_bytes(b"")
    assert repro.prepare_grid_folder(1e-3) == ([], [])
    assert (here / untested / RECORD).exists()


def test_rebuild_trains_committed_runs_again_and_compares_them(tmp_path, monkeypatch, capsys):
    """A new machine has the records but no checkpoints: `rebuild` trains those runs again,
    keeps the committed record as the run's record and reports how the two runs differ."""
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    runs, records = tmp_path / "runs", tmp_path / "records"
    monkeypatch.setattr(repro, "RUNS", runs)
    monkeypatch.setattr(repro, "RECORDS", records)
    monkeypatch.setattr(repro, "FIVE_PES", ("nope", "t5"))
    tiny = lambda *a, overrides, **k: run_sweep(  # noqa: E731
        *a, overrides={**SMALL, **overrides}, **{**k, "preset": "tiny"}
    )
    monkeypatch.setattr(repro, "run_sweep", tiny)
    with pytest.raises(NopeinterpError, match="run `grid` first"):
        repro.rebuild(1e-3, ["rsc"], [0])
    elsewhere = tmp_path / "elsewhere"  # the machine that ran the grid
    tiny([repro.task_spec("rsc")], ["nope", "t5"], [0], elsewhere, overrides={"lr": 1e-3},
         test="eval_set")  # fmt: skip
    committed = records / "lr=0.001"
    committed.mkdir(parents=True)
    for run in ("copy.variant=rsc-nope-seed0", "copy.variant=rsc-t5-seed0"):
        rec = json.loads((elsewhere / run / RECORD).read_text())
        if run.endswith("t5-seed0"):
            rec["accuracy"][0]["correct"] += 1  # as if the other machine had decoded otherwise
            del rec["val_history"]  # and written its record before histories were kept
        (committed / f"{run}.json").write_text(json.dumps(rec))
    # the grid restored the committed record here earlier, without its checkpoint
    (runs / "lr=0.001" / "copy.variant=rsc-nope-seed0").mkdir(parents=True)
    shutil.copyfile(committed / "copy.variant=rsc-nope-seed0.json",
                    runs / "lr=0.001" / "copy.variant=rsc-nope-seed0" / RECORD)  # fmt: skip

    repro.rebuild(1e-3, ["rsc"], [0])
    assert "rebuild: 2 of 2 runs to train again" in capsys.readouterr().out
    got = pd.read_csv(records / "analyses" / "lr=0.001" / "rebuilt_runs.csv")
    assert list(got["pe"]) == ["nope", "t5"]
    nope, t5 = got.iloc[0], got.iloc[1]
    # the same code, settings and seed on one machine: the very same run
    assert nope["max_loss_diff"] == 0 and nope["same_val"] and nope["same_test"]
    assert pd.isna(t5["max_loss_diff"]) and t5["same_val"] and not t5["same_test"]
    for run in ("copy.variant=rsc-nope-seed0", "copy.variant=rsc-t5-seed0"):
        here = runs / "lr=0.001" / run
        assert (here / repro.CHECKPOINT).exists() and (here / repro.REBUILT).exists()
        assert (here / RECORD).read_text() == (committed / f"{run}.json").read_text()
    repro.rebuild(1e-3, ["rsc"], [0])
    assert "rebuild: 0 of 2 runs to train again" in capsys.readouterr().out
    # their checkpoints are not the ones the records were tested on: `errors` leaves them out
    with pytest.raises(NopeinterpError, match="no tested run"):
        repro.error_kinds(1e-3, ["rsc"])
    assert "2 rebuilt runs left out" in capsys.readouterr().out
    # seed 1 ran here in the grid: its own checkpoints stay, not rebuilt nor marked as rebuilt,
    # and the table keeps listing the seed-0 runs rebuilt by the call before
    tiny([repro.task_spec("rsc")], ["nope", "t5"], [1], runs / "lr=0.001",
         overrides={"lr": 1e-3}, test="eval_set")  # fmt: skip
    for run in ("copy.variant=rsc-nope-seed1", "copy.variant=rsc-t5-seed1"):
        shutil.copyfile(runs / "lr=0.001" / run / RECORD, committed / f"{run}.json")
    repro.rebuild(1e-3, ["rsc"], [1])
    assert "0 of 2 runs to train again (2 have their own checkpoint here)" in (
        capsys.readouterr().out
    )
    got = pd.read_csv(records / "analyses" / "lr=0.001" / "rebuilt_runs.csv")
    assert list(zip(got["pe"], got["seed"], strict=True)) == [("nope", 0), ("t5", 0)]
    assert not (runs / "lr=0.001" / "copy.variant=rsc-nope-seed1" / repro.REBUILT).exists()
    repro.error_kinds(1e-3, ["rsc"])  # the seed-1 runs are the recorded ones: decoded
    assert "error kinds: 2 runs decoded" in capsys.readouterr().out
    # two rebuilds at once: the one that ends first leaves the other's run to the other
    tiny([repro.task_spec("rsc")], ["nope", "t5"], [2], elsewhere, overrides={"lr": 1e-3},
         test="eval_set")  # fmt: skip
    for run in ("copy.variant=rsc-nope-seed2", "copy.variant=rsc-t5-seed2"):
        shutil.copyfile(elsewhere / run / RECORD, committed / f"{run}.json")
    other = _lock(runs / "lr=0.001" / "copy.variant=rsc-t5-seed2" / repro.CHECKPOINT)
    repro.rebuild(1e-3, ["rsc"], [2])
    assert "1 runs not finished (training in another process" in capsys.readouterr().out
    got = pd.read_csv(records / "analyses" / "lr=0.001" / "rebuilt_runs.csv")
    assert set(zip(got["pe"], got["seed"], strict=True)) == {("nope", 0), ("t5", 0), ("nope", 2)}
    other.release()
    # the other process ends its run; until it is marked, `errors` must not take it for the
    # recorded run (its checkpoint and record are the rebuild's)
    tiny([repro.task_spec("rsc")], ["t5"], [2], runs / "lr=0.001", overrides={"lr": 1e-3},
         test="eval_set")  # fmt: skip
    repro.error_kinds(1e-3, ["rsc"])
    out = capsys.readouterr().out
    assert "4 rebuilt runs left out" in out and "0 runs decoded, 2 kept" in out
    repro.rebuild(1e-3, ["rsc"], [2])
    got = pd.read_csv(records / "analyses" / "lr=0.001" / "rebuilt_runs.csv")
    t5_2 = got[(got["pe"] == "t5") & (got["seed"] == 2)]
    assert len(got) == 4 and t5_2["same_val"].item() and t5_2["same_test"].item()


def test_compare_records_of_runs_whose_best_steps_differ():
    acc = lambda n: [{"split": "OOD", "length": 5, "correct": n}]  # noqa: E731
    hist = [
        {"step": 2, "loss": 1.0, "val_accuracy": 0.1},
        {"step": 4, "loss": 0.5, "val_accuracy": 0.3},
    ]
    old = {"val_history": hist, "best_step": 4, "val_accuracy": 0.3, "accuracy": acc(3),
           "ood_accuracy": 0.3}  # fmt: skip
    new = {**old, "val_history": [{**hist[0], "loss": 1.25}], "best_step": 2, "accuracy": acc(2)}
    got = repro.compare_records(old, new)
    assert got["max_loss_diff"] == 0.25 and not got["same_val"] and not got["same_test"]
    assert (got["best_step"], got["best_step_rebuilt"]) == (4, 2)
    assert repro.compare_records(old, old) | {"max_loss_diff": 0} == {
        **got,
        "max_loss_diff": 0,
        "same_val": True,
        "same_test": True,
        "best_step_rebuilt": 4,
    }


def test_committed_mrr_table_gives_the_paper_side_of_the_paper_runs():
    """REPORT's paper-side MRR column is read from the committed table: it must be what the MRR
    code gives on the paper's own per-run table, over the same splits and cells."""
    from nopeinterp.paper import PAPER_MRR_EXCLUDED, mean_reciprocal_rank, paper_runs

    committed = pd.read_csv(
        ROOT / "analyses" / "results" / "reproduction" / "tables" / "lr=0.001"
        / "paper_comparison_mrr.csv"
    )  # fmt: skip
    paper_side = committed[committed["side"] == "paper"].set_index("pe")
    splits = [s for s in PAPER_SPLITS if s not in PAPER_MRR_EXCLUDED]
    expected = mean_reciprocal_rank(paper_runs(), splits=splits).set_index("pe")
    assert len(splits) == 9 and (paper_side["n_cells"] == 27).all()
    for col in ("mrr", "ci_low", "ci_high"):
        assert paper_side[col].to_numpy() == pytest.approx(expected.loc[paper_side.index, col])
    assert round(paper_side.loc["nope", "mrr"], 3) == 0.784


def test_steps_to_is_the_first_evaluation_at_the_target():
    curve = [{"step": 2, "val_accuracy": 0.5}, {"step": 4, "val_accuracy": 0.96},
             {"step": 6, "val_accuracy": 0.97}]  # fmt: skip
    assert repro.steps_to(curve, 0.95) == 4
    assert repro.steps_to(curve, 0.99) is None and repro.steps_to(None, 0.95) is None


def test_pilot_trains_on_the_t5_preset_to_the_stop_rule_and_resumes(tmp_path, monkeypatch, capsys):
    """`pilot`: seed 0 of every (split, PE) per rate, on `repro-t5` with the stop rule and the
    step cap; records copied under RECORDS/pilot/, tabled by `pilot-table`, restored (not
    trained again) on a machine without runs/."""
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    runs, records = tmp_path / "runs", tmp_path / "records"
    monkeypatch.setattr(repro, "RUNS", runs)
    monkeypatch.setattr(repro, "RECORDS", records)
    monkeypatch.setattr(repro, "FIVE_PES", ("nope", "rotary"))
    calls = []
    small = {**SMALL, "n_layers": 1, "d_model": 32, "d_mlp": 64, "d_head": 16, "steps": 4}

    def sweep(*a, preset, overrides, **k):  # the pilot's settings, on a tiny shape
        calls.append((preset, overrides))
        return run_sweep(*a, preset=preset, overrides={**overrides, **small}, **k)

    monkeypatch.setattr(repro, "run_sweep", sweep)
    repro.pilot(lrs=[1e-3], steps=4, splits=["rsc"])
    assert calls == [("repro-t5", {"lr": 1e-3, "steps": 4, "stop_at_val": 0.95, "stop_evals": 2})]
    folder = records / "pilot" / "steps=4" / "lr=0.001"
    assert sorted(p.name for p in folder.glob("*.json")) == [
        "copy.variant=rsc-nope-seed0.json", "copy.variant=rsc-rotary-seed0.json"
    ]  # fmt: skip
    table = repro.pilot_runs()
    assert list(table["pe"]) == ["nope", "rotary"] and set(table["arch"]) == {"t5"}
    assert set(table["d_head"]) == {16} and set(table["steps_run"]) == {4}
    for row, path in zip(table.itertuples(), sorted(folder.glob("*.json")), strict=True):
        rec = json.loads(path.read_text())
        assert row.best_val == rec["val_accuracy"] and row.ood_accuracy == rec["ood_accuracy"]
        assert row.s_per_step == pytest.approx(1 / rec["throughput"]["steps_per_s"])
    assert len(repro.pilot_curves()) == 4  # 2 runs x 2 evaluations
    paths = repro.pilot_table(tmp_path / "tables")
    assert {p.name for p in paths} >= {"pilot_runs.csv", "pilot_curves.md"}

    shutil.rmtree(runs)  # a new machine: the committed records are restored, nothing retrains
    capsys.readouterr()
    repro.pilot(lrs=[1e-3], steps=4, splits=["rsc"])
    out = capsys.readouterr().out
    assert out.count("committed record restored") == 2 and out.count(": skipped") == 2
    assert not list(runs.rglob("model.pt"))
    with pytest.raises(NopeinterpError, match="steps"):
        repro.pilot(lrs=[1e-3], steps=0)


def test_commit_records_commits_only_the_named_paths(tmp_path, monkeypatch, capsys):
    import subprocess

    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "t")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "t@t")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setattr(repro, "ROOT", tmp_path)
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "a.json").write_text("{}")
    (tmp_path / "other.txt").write_text("x")
    repro.commit_records([tmp_path / "pilot"], "a record")

    def git(*args):
        cmd = ["git", "-C", str(tmp_path), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    assert git("log", "--format=%s") == "a record\n"
    assert git("show", "--name-only", "--format=") == "pilot/a.json\n"
    repro.commit_records([tmp_path / "pilot"], "nothing new")  # nothing to commit: one line
    assert "warning: not committed" in capsys.readouterr().out


def _v3(monkeypatch, tmp_path, n_layers=1):
    """analyses/reproduction_v3.py on tmp folders and a tiny shape (its settings otherwise)."""
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    import reproduction_v3 as v3

    monkeypatch.setattr(v3.repro, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(v3.repro, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v3, "FIVE_PES", ("nope", "t5"))
    monkeypatch.setattr(v3.repro, "FIVE_PES", ("nope", "t5"))
    calls = []
    small = {**SMALL, "n_layers": n_layers, "d_model": 32, "d_mlp": 64, "d_head": 16}

    def sweep(*a, preset, overrides, **k):
        calls.append((preset, dict(overrides)))
        return run_sweep(*a, preset=preset, overrides={**overrides, **small}, **k)

    monkeypatch.setattr(v3, "run_sweep", sweep)
    monkeypatch.setattr(v3.repro, "run_sweep", sweep)  # `rebuild` trains through reproduction.py
    return v3, calls


def test_v3_grid_runs_the_protocol_settings_seed_major_and_resumes(tmp_path, monkeypatch, capsys):
    v3, calls = _v3(monkeypatch, tmp_path)
    assert len(v3.V3_SPLITS) * len(PAPER_FIVE) * len(v3.V3_SEEDS) == 60  # the protocol's grid
    assert len(v3.v3_runs()) == len(v3.V3_SPLITS) * 2 * len(v3.V3_SEEDS)  # two PEs here
    v3.run_grid(splits=["rsc"], seeds=[0, 1])
    expected = {"lr": v3.V3_LR, "steps": v3.V3_STEPS, "stop_at_val": 0.95, "stop_evals": 2,
                "length_groups": 4}  # fmt: skip
    assert calls == [("repro-t5", expected)] * 2  # one sweep per seed, seed 0 first
    folder = tmp_path / "records" / "v3" / "lr=0.001"
    names = sorted(p.stem for p in folder.glob("*.json"))
    assert names == sorted(
        f"copy.variant=rsc-{pe}-seed{s}" for pe in ("nope", "t5") for s in (0, 1)
    )
    rec = json.loads((folder / "copy.variant=rsc-t5-seed1.json").read_text())
    assert rec["config"]["arch"] == "t5" and rec["ood_accuracy"] is not None
    shutil.rmtree(tmp_path / "runs")  # a new machine: committed records restored, not retrained
    capsys.readouterr()
    v3.run_grid(splits=["rsc"], seeds=[0, 1])
    out = capsys.readouterr().out
    assert out.count("committed record restored") == 4 and out.count(": skipped") == 4
    assert not list((tmp_path / "runs").rglob("model.pt"))
    with pytest.raises(NopeinterpError, match="not in the protocol: cmc, 7"):
        v3.run_grid(splits=["cmc"], seeds=[7])


def test_v3_analyse_runs_claims_2_to_4_on_the_grids_checkpoints(tmp_path, monkeypatch):
    """`analyse` reads this grid's own run folders (not the first grid's) and writes under
    results/reproduction/v3/lr=<lr>/analyses/<split>/; NoPE-prime is the NoPE run of seed 1."""
    v3, _ = _v3(monkeypatch, tmp_path, n_layers=2)  # a first block and a later one
    v3.run_grid(splits=["rsc"], seeds=[0, 1])
    v3.analyse(["rsc"], quick=True)
    written = tmp_path / "records" / "v3" / "lr=0.001" / "analyses" / "rsc"
    probes = pd.read_csv(written / "position_probes.csv")
    assert set(probes["pe"]) == {"nope", "t5"} and set(probes["task"]) == {"copy"}
    assert set(pd.read_csv(written / "distance_dependence.csv")["pe"]) == {"nope", "t5"}
    refs = set(pd.read_csv(written / "attention_similarity.csv")["ref"])
    assert refs == {"t5", "nope_prime"}
    assert not (tmp_path / "records" / "analyses").exists()  # not the first grid's folder
    # the report's lines on claims 2-4 come from these files
    found = v3.mechanisms()
    assert list(found) == ["rsc"]
    seeds = pd.read_csv(written / "position_probes_seeds.csv")
    want = seeds[seeds["layer"] == 1].set_index("pe")["ID r2_mean"]
    assert found["rsc"]["probes"].set_index("pe")["ID r2_mean"].to_dict() == want.to_dict()
    dist = pd.read_csv(written / "distance_dependence_seeds.csv")
    later = dist[(dist["layer"] >= 1) & (dist["pe"] == "nope") & (dist["split"] == "ID")]
    row = found["rsc"]["distance"].set_index(["pe", "split"]).loc[("nope", "ID")]
    assert row["score_mean_heads"] == pytest.approx(later["score_mean_heads_mean"].mean())
    assert set(found["rsc"]["similarity"]["ref"]) == {"t5", "nope_prime"}
    lines = "\n".join(v3.mechanisms_lines(found))
    assert "**rsc.**" in lines and "Not analysed yet" not in lines and "trained again" not in lines
    assert "Not analysed yet" in "\n".join(v3.mechanisms_lines({}))
    assert set(found["rsc"]["similarity_cross_seeds"]["ref"]) == {"t5", "nope_prime"}
    # the decision rules read the per-seed files `analyse` wrote
    r = {"runs": v3.grid_runs(), "verdict": None}
    rows = v3.verdicts(r, found).set_index("claim")["verdict"]
    probes = found["rsc"]["probes_per_seed"]
    import _claim_rules as rules

    assert rows[v3.CLAIMS[2]] == (
        f"rsc (2 seeds): {rules.theorem1_verdict(probes)[0]}; mdlen: not analysed yet"
    )
    assert rules.theorem1_verdict(probes)[0] != rules.NOT_EVALUATED
    assert rows[v3.CLAIMS[3]].startswith(f"rsc (2 seeds): {rules.NOT_EVALUATED};")  # no sinusoidal
    assert rows[v3.CLAIMS[4]] == "rsc (2 seeds): supported; mdlen: not analysed yet"
    with pytest.raises(NopeinterpError, match="not in the protocol: cmc"):
        v3.analyse(["cmc"])


def test_v3_rebuild_trains_the_grids_runs_again_with_its_settings(tmp_path, monkeypatch, capsys):
    """On a new machine the committed records are there, the checkpoints are not: `rebuild`
    trains those runs again with the grid's own preset and settings (not the first grid's),
    in the grid's folder, and `analyse` then says which checkpoints it read were rebuilt."""
    v3, calls = _v3(monkeypatch, tmp_path)
    v3.run_grid(splits=["rsc"], seeds=[0])
    shutil.rmtree(tmp_path / "runs")  # a new machine
    v3.run_grid(splits=["rsc"], seeds=[0])  # restores the records, trains nothing
    calls.clear()
    capsys.readouterr()
    v3.analyse(["rsc"], quick=True)
    assert "no finished run's checkpoint here" in capsys.readouterr().out
    v3.rebuild(["rsc"], [0])
    assert "rebuild: 2 of 2 runs to train again" in capsys.readouterr().out
    protocol = {"lr": v3.V3_LR, "steps": v3.V3_STEPS, "stop_at_val": 0.95, "stop_evals": 2,
                "length_groups": 4}  # fmt: skip
    assert calls == [("repro-t5", protocol)]
    got = pd.read_csv(tmp_path / "records" / "v3" / "lr=0.001" / "analyses" / "rebuilt_runs.csv")
    assert list(got["pe"]) == ["nope", "t5"]
    assert got["same_val"].all() and got["same_test"].all()  # one machine: the same runs
    assert not (tmp_path / "records" / "analyses").exists()  # not the first grid's folder
    here = tmp_path / "runs" / "v3" / "lr=0.001"
    assert all(
        (here / f"copy.variant=rsc-{pe}-seed0" / "model.pt").exists() for pe in ("nope", "t5")
    )
    v3.analyse(["rsc"], quick=True)
    assert "rsc: 2 analysed checkpoints were trained again here" in capsys.readouterr().out
    with pytest.raises(NopeinterpError, match="not in the grid's records yet"):
        v3.rebuild(["rsc"], [1])
    # runs recorded with other length groups (the grid's first runs: the padded batch) are
    # trained again with theirs: one sweep per (split, seed, setting), each with its PEs
    v3.run_grid(splits=["rsc"], seeds=[1])
    committed = tmp_path / "records" / "v3" / "lr=0.001" / "copy.variant=rsc-nope-seed1.json"
    rec = json.loads(committed.read_text())
    del rec["config"]["length_groups"]  # as the records written before the setting
    committed.write_text(json.dumps(rec))
    runs = v3.grid_runs().set_index(["split", "pe", "seed"])["length_groups"]
    assert runs[("rsc", "nope", 1)] == 1 and runs[("rsc", "t5", 1)] == 4
    shutil.rmtree(here)
    calls.clear()
    v3.rebuild(["rsc"], [1])
    assert calls == [("repro-t5", {**protocol, "length_groups": 1}), ("repro-t5", protocol)]
    assert (here / "copy.variant=rsc-nope-seed1" / "record.rebuilt.json").exists()
    rebuilt = json.loads((here / "copy.variant=rsc-t5-seed1" / "record.rebuilt.json").read_text())
    assert rebuilt["config"]["length_groups"] == 4


def test_v3_gpu_check_compares_two_short_runs(tmp_path, monkeypatch):
    """The GPU's agreement check, run here with CPU bf16 autocast in the GPU's place."""
    v3, calls = _v3(monkeypatch, tmp_path)
    monkeypatch.setattr(v3, "V3_CHECK", ("rsc", "nope", 0, 4))
    check = v3.gpu_check(tmp_path / "check", devices=(("cpu", "fp32"), ("cpu", "bf16")))
    assert [c[1]["precision"] for c in calls] == ["fp32", "bf16"]
    loss = {k: [h["loss"] for h in c if h["step"] > 2] for k, c in check["curves"].items()}
    (a,), (b,) = loss.values()
    assert check["relative_difference"] == pytest.approx(abs(b - a) / a)
    assert check["agree"] == (check["relative_difference"] <= v3.GPU_CHECK_RTOL)
    assert a != b  # bf16 autocast changed the computation: the check compares two real runs


def _fake_v3_records(folder, ood_by_pe, val=0.97, splits=("rsc", "rdc", "mc", "mdlen")):
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for pe, ood in ood_by_pe.items():
            for seed in (0, 1, 2):
                rec = {"lr": 1e-3, "split": split, "pe": pe, "seed": seed, "ood_accuracy": ood,
                       "val_accuracy": val if pe != "t5" else 0.9, "best_step": 900,
                       "steps": 8000, "run_wall_s": 60.0,
                       "accuracy": [  # two test lengths; the second at seed / 10 below the first
                           {"split": "OOD", "length": 30, "accuracy": ood, "evaluable": True},
                           {"split": "OOD", "length": 31, "accuracy": ood - seed / 10,
                            "evaluable": True}]}  # fmt: skip
                (folder / f"{split}-{pe}-seed{seed}.json").write_text(json.dumps(rec))


@pytest.mark.parametrize(
    "first, verdict",
    [("nope", "reproduced: NoPE above every explicit PE"), ("rotary", "contradicted: rotary")],
)
def test_v3_table_writes_convergence_comparison_and_the_claim1_verdict(
    tmp_path, monkeypatch, first, verdict
):
    v3, _ = _v3(monkeypatch, tmp_path)
    monkeypatch.setattr(v3, "FIVE_PES", PAPER_FIVE)
    monkeypatch.setattr(v3.repro, "FIVE_PES", PAPER_FIVE)
    order = [first, *(p for p in PAPER_FIVE if p != first)]
    ood = {pe: 0.5 - 0.1 * i for i, pe in enumerate(order)}  # the same ranking in every cell
    _fake_v3_records(tmp_path / "records" / "v3" / "lr=0.001", ood)
    v2_ood = {pe: 0.1 * i for i, pe in enumerate(order)}  # the first grid: the reverse order
    _fake_v3_records(tmp_path / "records" / "lr=0.001", v2_ood, val=0.5)
    paths = v3.table(tmp_path / "tables")
    names = {p.name for p in paths}
    assert {"runs.csv", "convergence.csv", "against_v2.csv", "claim1_verdict.csv"} <= names
    assert {"converging_changed.csv", "size.csv", "shapes.csv", "verdicts.csv"} <= names
    assert "accuracy_by_length.csv" in names
    # Kendall's tau per split against the paper's order, computed here by scipy
    from scipy.stats import kendalltau

    from nopeinterp.paper import paper_runs

    agreement = pd.read_csv(tmp_path / "tables" / "paper_comparison_agreement.csv")
    paper_means = paper_runs().groupby(["split", "pe"])["ood_accuracy"].mean()
    for row in agreement.itertuples():
        theirs = [paper_means[(row.split, pe)] for pe in PAPER_FIVE]
        assert row.kendall_tau == pytest.approx(kendalltau([ood[p] for p in PAPER_FIVE], theirs)[0])
    assert set(agreement["split"]) == {"rsc", "rdc", "mc", "mdlen"}
    ties = pd.read_csv(tmp_path / "tables" / "paper_comparison_mrr_ties_averaged.csv")
    ours_ties = ties[ties["side"] == "ours"].set_index("pe")["mrr"]
    assert ours_ties[first] == 1.0  # no ties here: first in every cell
    changed = pd.read_csv(tmp_path / "tables" / "converging_changed.csv").set_index("split")
    assert changed["ood_v3"].tolist() == pytest.approx([sum(ood.values()) / 5] * 4)
    assert set(changed["best_v3"]) == {first}
    assert changed["nope_ood_v3"].tolist() == pytest.approx([ood["nope"]] * 4)
    assert set(changed["best_v2"]) == {order[-1]} and changed["val_v2"].tolist() == pytest.approx(
        [(4 * 0.5 + 0.9) / 5] * 4
    )
    assert changed["ood_v2"].tolist() == pytest.approx([sum(v2_ood.values()) / 5] * 4)
    size = pd.read_csv(tmp_path / "tables" / "size.csv").set_index(["split", "pe"])
    assert set(size.index) == {(s, p) for s in ("rsc", "rdc") for p in ("nope", "t5", "sinusoidal")}
    assert size.loc[("rsc", "nope"), "ours_v3"] == pytest.approx(ood["nope"])
    assert size.loc[("rsc", "nope"), "paper_base"] == 0.9352  # the paper's file, by hand
    assert size.loc[("rdc", "nope"), "paper_xsmall"] == 0.237
    shapes = pd.read_csv(tmp_path / "tables" / "shapes.csv").set_index("model")
    for model, row in shapes.iterrows():  # T5 decoder without a PE: attention, MLP, 2 norms each
        per_layer = 4 * row.d_model * row.n_heads * row.d_head + 2 * row.d_model * row.d_mlp
        expected = row.n_layers * (per_layer + 2 * row.d_model) + row.d_model
        assert row.params_non_embedding == expected, model
    assert shapes.loc["paper base", ["n_layers", "d_model", "n_heads", "d_head"]].tolist() == [
        12,
        768,
        12,
        64,
    ]
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert len(runs) == 60 and set(runs["status"]) == {"done"}
    assert runs["capped"].sum() == 12 and set(runs.loc[runs["capped"], "pe"]) == {"t5"}
    conv = pd.read_csv(tmp_path / "tables" / "convergence.csv")
    assert conv.set_index("pe").loc["t5", "share_reached"].tolist() == [0.0] * 4
    got = pd.read_csv(tmp_path / "tables" / "claim1_verdict.csv")["verdict"].item()
    assert got.startswith(verdict)
    rows = pd.read_csv(tmp_path / "tables" / "verdicts.csv")
    assert rows["claim"].tolist() == list(v3.CLAIMS.values())
    assert rows["verdict"].tolist() == [got] + ["not analysed yet"] * 3
    assert (
        "MRR on 12 complete (split, seed) cells; 48 of 60 runs reached 0.95" in rows["evidence"][0]
    )
    report = tmp_path / "REPORT.md"
    first_grid = "**The first grid's verdicts** (by hand)\n\n| claim | verdict |\n"
    report.write_text(f"# Part 1\n\n## Verdicts\n\n{first_grid}\ntext\n\n# Part 2: later\n")
    for _ in range(2):  # each block goes to its place, then is replaced in place
        v3.report(path=report)
    text = report.read_text()
    assert text.count(v3.BEGIN) == 1 and text.index(v3.END) < text.index("# Part 2: later")
    assert text.count(v3.VERDICTS_BEGIN) == 1 and text.count(first_grid) == 1
    block = text[text.index(v3.VERDICTS_BEGIN) : text.index(v3.VERDICTS_END)]
    assert text.index("## Verdicts") < text.index(v3.VERDICTS_END) < text.index(first_grid)
    assert f"| {v3.CLAIMS[1]} | {got} |" in block and "Interim" not in block
    # the figure: per split, our runs (reached / capped) and the paper's, each legend entry once
    fig = v3.ood_figure(v3.grid_runs(), paper_runs())
    assert len(fig.data) == 3 * len(v3.V3_SPLITS)
    reached, capped, paper = fig.data[:3]  # the first split's panel
    assert sorted(reached.y) == sorted([ood[p] for p in PAPER_FIVE if p != "t5"] * 3)
    assert list(capped.x) == ["t5"] * 3 and list(capped.y) == [ood["t5"]] * 3
    want = paper_runs().query("split == @v3.V3_SPLITS[0]")["ood_accuracy"]
    assert sorted(paper.y) == sorted(want)
    assert sorted(t.name for t in fig.data if t.showlegend) == sorted({t.name for t in fig.data})
    by_length = v3.repro.accuracy_by_length(v3.V3_LR, tmp_path / "records" / "v3")
    lines = v3.length_figure(by_length).data
    assert len(lines) == len(v3.V3_SPLITS) * len(PAPER_FIVE)  # a line per PE in each split's panel
    assert list(lines[0].x) == [30, 31] and lines[0].name == PAPER_FIVE[0]
    assert list(lines[0].y) == pytest.approx([ood[PAPER_FIVE[0]], ood[PAPER_FIVE[0]] - 0.1])
    assert (
        "![Exact match by test length, per split and PE](records/v3/accuracy_by_length.png)"
        in (text)
        or not (tmp_path / "records" / "v3" / "accuracy_by_length.png").exists()
    )
    assert f"Claim 1 by the protocol's decision rule: {got}" in text
    for heading in ("What converging changed", "Size:", "The three shapes", "Kendall's tau-b"):
        assert heading in text
    assert "### Claims 2-4 on this grid's checkpoints\n\nNot analysed yet" in text
    assert "60 of 60 runs done" in text and "Interim" not in text
    assert "Batches: 60 runs on the padded batch." in text  # records without the setting
    for rec in (tmp_path / "records" / "v3" / "lr=0.001").glob("mdlen-*.json"):
        rec.unlink()  # a grid cut short: its verdict is marked as one on part of the grid
    for path in (tmp_path / "records" / "v3" / "lr=0.001").glob("rdc-*.json"):
        rec = json.loads(path.read_text())
        path.write_text(json.dumps({**rec, "config": {"length_groups": 4}}))
    v3.report(path=report)
    text = report.read_text()
    assert "45 of 60 runs done" in text
    assert "Batches: 30 runs on the padded batch, 15 runs in 4 length groups (length" in text
    assert "**Interim, on 9 of the grid's 12 (split, seed) cells, not the grid's verdict" in text
    block = text[text.index(v3.VERDICTS_BEGIN) : text.index(v3.VERDICTS_END)]
    assert "Interim: 45 of the grid's 60 runs are in" in block


def _probe_rows(trained: dict, random_init: dict) -> pd.DataFrame:
    """position_probes.csv rows: NoPE after the first block, per test a value per seed."""
    rows = [
        {"pe": "nope", "layer": 1, "metric": "r2", "split": test, "model": model, "seed": s,
         "value": v}
        for model, values in (("trained", trained), ("random_init", random_init))
        for test, seeds in values.items() for s, v in enumerate(seeds)
    ]  # fmt: skip
    noise = {**rows[0], "layer": 2, "value": -1.0}  # another layer: not read
    return pd.DataFrame([*rows, noise, {**rows[0], "metric": "mae", "value": 99.0}])


def test_theorem1_rule_compares_every_trained_seed_with_every_random_init_seed(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    import _claim_rules as rules

    init = {"ID": [0.90, 0.91, 0.93], "OOD": [0.70, 0.81, 0.75]}
    both = _probe_rows({"ID": [0.95, 0.96, 0.97], "OOD": [0.82, 0.85, 0.90]}, init)
    verdict, evidence = rules.theorem1_verdict(both)
    assert verdict == "supported"
    assert (
        evidence
        == "ID R² [0.950, 0.970] (random init [0.900, 0.930]); OOD R² [0.820, 0.900] (random init [0.700, 0.810])"
    )
    id_only = _probe_rows({"ID": [0.95, 0.96, 0.97], "OOD": [0.80, 0.85, 0.90]}, init)
    assert rules.theorem1_verdict(id_only)[0] == "supported in distribution only"  # 0.80 < 0.81
    neither = _probe_rows({"ID": [0.92, 0.96, 0.97], "OOD": [0.82, 0.85, 0.90]}, init)
    assert rules.theorem1_verdict(neither)[0] == "not supported"  # 0.92 < 0.93
    no_init = both[both["model"] == "trained"]
    assert rules.theorem1_verdict(no_init)[0] == rules.NOT_EVALUATED


def _distance_rows(scores: dict) -> pd.DataFrame:
    """distance_dependence.csv rows: per (pe, test) a later-layer score per seed, spread over
    blocks 2 and 3 (their mean is the score); block 1 far off, to show it is not read."""
    rows = []
    for (pe, test), seeds in scores.items():
        for s, v in enumerate(seeds):
            for layer, x in ((0, 5.0), (1, v - 0.01), (2, v + 0.01)):
                rows.append({"pe": pe, "split": test, "seed": s, "layer": layer, "mean": x})
    return pd.DataFrame(rows)


def test_theorem2_rule_needs_nope_above_the_absolute_pe_and_not_below_t5(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    import _claim_rules as rules

    base = {"t5": [0.10, 0.14, 0.12], "alibi": [0.80, 0.90, 0.85], "rotary": [0.12, 0.13, 0.20],
            "sinusoidal": [0.02, 0.03, 0.04]}  # fmt: skip

    def rows(nope_id, nope_ood, **ood_override):
        scores = {(pe, t): v for pe, v in base.items() for t in ("ID", "OOD")}
        scores.update({("nope", "ID"): nope_id, ("nope", "OOD"): nope_ood})
        scores.update({(pe, "OOD"): v for pe, v in ood_override.items()})
        return _distance_rows(scores)

    verdict, evidence = rules.theorem2_verdict(rows([0.11, 0.15, 0.13], [0.11, 0.15, 0.13]))
    assert verdict == "shown"
    assert evidence.split(" | ")[0] == (
        "ID NoPE [0.110, 0.150]: above sinusoidal; below alibi; not separated from t5, rotary"
    )
    # T5 wholly above NoPE on OOD: the absolute PE is beaten, but not the relative bias
    partly = rows([0.11, 0.15, 0.13], [0.06, 0.08, 0.07], t5=[0.30, 0.31, 0.32])
    assert rules.theorem2_verdict(partly)[0] == "partly"
    # NoPE not above the sinusoidal APE on either test (ranges overlap)
    none = rows([0.03, 0.05, 0.06], [0.01, 0.05, 0.06])
    assert rules.theorem2_verdict(none)[0] == "not shown"
    no_control = _distance_rows({("nope", "ID"): [0.1], ("t5", "ID"): [0.1]})
    assert rules.theorem2_verdict(no_control)[0] == rules.NOT_EVALUATED


def _ranking_rows(jsd: dict) -> pd.DataFrame:
    """attention_similarity_cross_seeds.csv rows: per (test, ref) a JSD per seed."""
    return pd.DataFrame(
        [{"split": test, "ref": ref, "seed": s, "mean": v}
         for (test, ref), seeds in jsd.items() for s, v in enumerate(seeds)]
    )  # fmt: skip


def test_claim4_rule_counts_the_rankings_where_t5_is_the_closest_explicit_pe(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    import _claim_rules as rules

    def rows(t5_id, t5_ood, prime=(0.140, 0.145)):
        jsd = {}
        for test, t5 in (("ID", t5_id), ("OOD", t5_ood)):
            jsd.update({(test, "t5"): t5, (test, "nope_prime"): list(prime),
                        (test, "alibi"): [0.150, 0.150], (test, "rotary"): [0.20, 0.21],
                        (test, "sinusoidal"): [0.25, 0.26]})  # fmt: skip
        return _ranking_rows(jsd)

    verdict, evidence = rules.claim4_verdict(rows([0.141, 0.146], [0.120, 0.130]))
    assert verdict == "supported"
    assert evidence == (
        "T5 the closest explicit PE in 4 of 4 cross-seed rankings; "
        "ID: T5 [0.141, 0.146], not separated from NoPE-prime ([0.140, 0.145]); "
        "OOD: T5 [0.120, 0.130], closer than NoPE-prime ([0.140, 0.145])"
    )
    assert rules.claim4_verdict(rows([0.141, 0.146], [0.160, 0.170]))[0] == "partly"  # 2 of 4
    nope = rules.claim4_verdict(rows([0.141, 0.155], [0.160, 0.170]))
    assert nope[0] == "not supported" and "in 1 of 4" in nope[1]
    assert "further than NoPE-prime" in nope[1]
    no_t5 = _ranking_rows({("ID", "alibi"): [0.1], ("ID", "nope_prime"): [0.1]})
    assert rules.claim4_verdict(no_t5)[0] == rules.NOT_EVALUATED


def test_claim1_verdict_rule():
    from nopeinterp.paper import claim1_verdict

    def sep(*verdicts):
        return pd.DataFrame({"side": "ours", "verdict": list(verdicts)})

    all_above = sep(*(f"nope above {p}" for p in ("t5", "alibi", "rotary", "sinusoidal")))
    assert claim1_verdict(all_above).startswith("reproduced")
    assert claim1_verdict(sep("nope above t5", "not separated")) == (
        "not separated (NoPE above t5 only)"
    )
    assert claim1_verdict(sep("not separated")) == "not separated"
    assert claim1_verdict(sep("nope above t5", "alibi above nope")).startswith("contradicted")
