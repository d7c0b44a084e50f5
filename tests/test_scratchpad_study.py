"""The scratchpad study's driver (analyses/scratchpad_study.py) on a tiny grid: records, the
tables and REPORT.md's section, regenerated from the records by `report`."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "analyses"))
    import scratchpad_study as s

    monkeypatch.setattr(s, "TASKS", ("addition:scratchpad=icovr,id_lengths=1-2,ood_lengths=3-3",))
    monkeypatch.setattr(s, "PES", ("nope", "t5"))
    monkeypatch.setattr(s, "SEEDS", (0,))
    tiny = dict(n_layers=1, n_heads=2, d_model=32, d_mlp=64, d_head=16, steps=4, batch_size=8,
                eval_every=2, eval_n=2, length_groups=2)  # fmt: skip
    monkeypatch.setattr(s, "OVERRIDES", {**s.OVERRIDES, **tiny})
    for name, value in (("RUNS", tmp_path / "runs"), ("OUT", tmp_path / "out"),
                        ("RECORDS", tmp_path / "out" / "records"),
                        ("REGIONS_OUT", tmp_path / "out" / "regions"),
                        ("ID_STEPS_OUT", tmp_path / "out" / "id_steps"),
                        ("REPORT", tmp_path / "REPORT.md")):  # fmt: skip
        monkeypatch.setattr(s, name, value)
    # every folder the driver writes is redirected here, none left pointing into the repository
    left = [n for n, v in vars(s).items() if isinstance(v, Path) and n not in ("ROOT", "RESULTS")
            and v.is_relative_to(ROOT)]  # fmt: skip
    assert not left, f"patch these paths too: {left}"
    s.REPORT.write_text("# Report\n\nearlier text\n")
    yield s
    sys.modules.pop("scratchpad_study", None)


def test_the_study_records_its_runs_and_regenerates_its_report_section(study):
    s = study
    s.report()  # before any run: the section says so, the rest of the file stays
    text = s.REPORT.read_text()
    assert "earlier text" in text and "**Runs finished: 0 of 2.**" in text
    s.run(max_runs=None, commit=False)
    records = sorted(p.name for p in s.RECORDS.glob("*.json"))
    assert len(records) == 2 and all("scratchpad=icovr" in r for r in records)
    rec = json.loads((s.RECORDS / records[0]).read_text())
    assert rec["config"]["length_groups"] == 2 and rec["config"]["stop_at_val"] == 0.95
    assert {a["split"] for a in rec["accuracy"]} == {"OOD"}
    assert all(a.get("steps_right") is not None for a in rec["accuracy"])  # per-step scores
    text = s.REPORT.read_text()
    assert text.count(s.BEGIN) == 1 and "**Runs finished: 2 of 2.** The study is complete." in text
    assert "Batches: 2 runs in 2 length groups (length groups:" in text
    comparison = pd.read_csv(s.OUT / "addition_icovr_vs_paper.csv").set_index("pe")
    assert comparison.loc["nope", "our_runs"] == 1 and comparison.loc["nope", "paper_runs"] == 3
    # LEGO beside the paper's aggregates, read here from the official file by hand
    import csv

    from nopeinterp.paper import PAPER_AGGREGATES

    with open(PAPER_AGGREGATES) as f:
        paper = {(r["pe"], r["scratchpad"]): float(r["test_acc_mean"]) for r in csv.DictReader(f)
                 if r["dataset"] == "s2s_lego" and r["split"] == "len_tr8_ts16"}  # fmt: skip
    lego = pd.read_csv(s.OUT / "lego_vs_paper.csv").set_index(["pe", "scratchpad"])
    assert list(lego.index) == [("nope", "none"), ("nope", "icor")]  # t5: none on this split
    assert lego.loc[("nope", "none"), "paper_ood_mean"] == paper[("none", "False")]
    assert lego.loc[("nope", "icor"), "paper_ood_mean"] == paper[("none", "True")]
    assert (lego["our_runs"] == 0).all()  # no LEGO run in this tiny grid
    assert "The PEs the paper reports there: nope." in text
    # where the scratchpads go wrong: the records' per-length step scores, over runs
    steps = pd.read_csv(s.OUT / "steps_by_length.csv")
    # ID lengths from each run's in-distribution file (written by `run`), OOD from the records
    pairs = set(zip(steps["split"], steps["length"], strict=True))
    assert sorted(pairs) == [("ID", 1), ("ID", 2), ("OOD", 3)]
    for name in records:
        view = pd.read_csv(s.ID_STEPS_OUT / name.replace(".json", ".csv"))
        assert list(view["length"]) == [1, 2] and set(view["split"]) == {"ID"}
        rec_pe = json.loads((s.RECORDS / name).read_text())["pe"]
        got = steps[(steps["pe"] == rec_pe) & (steps["split"] == "ID")].set_index("length")
        assert list(got["steps_right"]) == pytest.approx(list(view["steps_right"]))
        assert list(got["exact_match"]) == pytest.approx(list(view["accuracy"]))
    assert "In distribution and out" in s.REPORT.read_text()
    steps = steps[steps["split"] == "OOD"].set_index(["pe", "length"])
    for name in records:
        r = json.loads((s.RECORDS / name).read_text())
        for a in r["accuracy"]:
            row = steps.loc[(r["pe"], a["length"])]
            assert row["runs"] == 1 and row["steps_right"] == pytest.approx(a["steps_right"])
            if a["first_wrong_step"] == a["first_wrong_step"]:  # not NaN
                assert row["first_wrong_step"] == pytest.approx(a["first_wrong_step"])
    # addition's gold steps from the prompts' operands: one per digit column, one more when the
    # last column carries; the mean over the same STEP_SAMPLES examples the study draws
    import random

    from nopeinterp.tasks import get_task

    task, rng = get_task("addition", **rec["task_options"]), random.Random(0)
    counts = []
    for _ in range(s.STEP_SAMPLES):
        a, b = ("".join(x.split()) for x in task.sample(3, rng).prompt[8:-2].split(" + "))
        counts.append(max(len(a), len(b)) + (len(str(int(a) + int(b))) > max(len(a), len(b))))
    assert set(steps["gold_steps"]) == {sum(counts) / len(counts)}
    assert 3 < sum(counts) / len(counts) < 4  # some sums carry out of the last column
    assert "## Where the scratchpads go wrong" in text
    # a record written before the setting counts as the padded batch
    path = s.RECORDS / records[0]
    path.write_text(json.dumps({**rec, "config": {k: v for k, v in rec["config"].items()
                                                  if k != "length_groups"}}))  # fmt: skip
    s.report()
    text = s.REPORT.read_text()
    assert text.count(s.BEGIN) == 1 and "earlier text" in text
    assert text.count("## Where the scratchpads go wrong") == 1
    assert "Batches: 1 run on the padded batch, 1 run in 2 length groups" in text
    runs = pd.read_csv(s.OUT / "runs.csv")
    assert sorted(runs["length_groups"]) == [1, 2]
    s.run(max_runs=None, commit=False)  # recorded runs are not run again
    assert sorted(p.name for p in s.RECORDS.glob("*.json")) == records


def test_the_regions_view_reads_each_finished_checkpoint_once(study, capsys):
    s = study
    s.run(max_runs=None, commit=False)
    first, second = sorted(s.RECORDS.glob("*.json"))
    # `run` writes each finished run's file; removed here, `regions` writes them again
    assert sorted(p.stem for p in s.REGIONS_OUT.glob("*.csv")) == [first.stem, second.stem]
    for path in s.REGIONS_OUT.glob("*.csv"):
        path.unlink()
    s.report()
    assert "No run analysed yet" in s.REPORT.read_text()
    (s.RUNS / second.stem / "model.pt").unlink()  # trained on another machine
    written = s.regions()
    assert [p.name for p in written] == [f"{first.stem}.csv"]
    assert "no checkpoint on this machine, skipped" in capsys.readouterr().out
    table = pd.read_csv(written[0])
    rows = table.groupby(["split", "layer", "query_region"])["mass"].sum()
    assert rows.to_numpy() == pytest.approx(1.0, abs=1e-4)  # each query's mass over key regions
    assert {"ID", "OOD"} == set(table["split"]) and "output" in set(table["query_region"])
    assert s.regions() == []  # written once; --force writes again
    s.report()
    summary = pd.read_csv(s.OUT / "regions_last_layer.csv")
    last = table[(table["query_region"] == "output") & (table["layer"] == table["layer"].max())]
    want = last.set_index(["split", "key_region"])["mass"]
    for row in summary.itertuples():
        assert row.pe == "nope" and row.seeds == 1
        assert row.computation == pytest.approx(want[(row.split, "computation")], abs=1e-4)
    text = s.REPORT.read_text()
    assert "## Where the models look while writing a scratchpad" in text
    assert "of 1 finished runs" in text and text.count(s.BEGIN) == 1


def test_formats_without_the_queried_component_are_named_not_dropped_silently(study):
    table = pd.DataFrame({"pe": ["nope"], "computation": [0.5]})
    text = "\n".join(study.regions_lines(table, 2, ["ivr"]))
    assert "of 2 finished runs" in text and "Formats without the output component (`ivr`)" in text
    assert "Formats without" not in "\n".join(study.regions_lines(table, 2))


def test_records_decoded_with_the_batch_bound_are_tested_again_once(study, capsys):
    s = study
    s.run(max_runs=None, commit=False)
    first, second = sorted(s.RECORDS.glob("*.json"))
    text = s.REPORT.read_text()
    assert "Runs: 2 tested with each item decoded to its own bound." in text
    # records as written before the per-item bound: no `decode_bound`; marked numbers
    for path in (first, second):
        rec = json.loads(path.read_text())
        del rec["decode_bound"]
        path.write_text(json.dumps({**rec, "ood_accuracy": -1.0}))
    (s.RUNS / second.stem / "model.pt").unlink()  # trained on another machine
    again = s.retest_runs()
    assert again == [first.stem]
    assert "not tested again" in capsys.readouterr().out
    rec = json.loads(first.read_text())
    assert rec["previous_test"]["ood_accuracy"] == -1.0 and 0 <= rec["ood_accuracy"] <= 1
    assert s.retest_runs() == []  # once
    runs = pd.read_csv(s.OUT / "runs.csv").set_index("pe")
    assert runs["test_bound"].to_dict() == {"nope": "per item", "t5": "batch"}
    assert runs["val_bound"].to_dict() == {"nope": "batch", "t5": "batch"}
    text = s.REPORT.read_text()
    assert "1 tested with each item decoded to its own bound; 1 **not yet tested again**" in text
    table = pd.read_csv(s.OUT / "retested.csv")
    assert list(table["pe"]) == ["nope"] and table["ood_batch_bound"].item() == -1.0
    assert table["ood_per_item"].item() == rec["ood_accuracy"]
