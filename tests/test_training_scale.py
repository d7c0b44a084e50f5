"""Issue 15 acceptance: torchrun data parallelism (gloo, CPU) and resumable, shardable sweeps."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from nopeinterp import load_checkpoint
from nopeinterp.cli import main
from nopeinterp.errors import NopeinterpError
from nopeinterp.training import make_config, train
from nopeinterp.training.sweep import (
    NONDETERMINISTIC,
    collect,
    grid,
    parse_task_spec,
    run_name,
    run_sweep,
)

TASK = "copy:id_lengths=2-5,ood_lengths=6-8"
# a small run: the tiny preset (1 layer, d_model 32, 2 heads), global batch 16
RUN = ["--task", TASK, "--pe", "nope", "--preset", "tiny", "--batch-size", "16"]


def descendants(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [q for c in map(int, children) for q in (c, *descendants(c))]


def single(tmp_path, name, steps, **overrides):
    """The same run in this process (1 thread, as each torchrun rank here)."""
    options = parse_task_spec(TASK)[1]
    cfg = make_config(
        "copy", "nope", tmp_path / name, preset="tiny", batch_size=16, steps=steps,
        eval_every=steps, task_options=options, progress=False, **overrides,
    )  # fmt: skip
    return load_checkpoint(train(cfg)).model.state_dict()


def weights(path):
    return load_checkpoint(path).model.state_dict()


def test_torchrun_two_ranks_equal_a_single_process(tmp_path, torchrun):
    out = tmp_path / "ddp.pt"
    proc = torchrun([*RUN, "--steps", "6", "--eval-every", "6", "--out", str(out)])
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, log
    assert log.count("best checkpoint:") == 1  # rank 0 alone reports (and writes)
    ddp = weights(out)
    assert load_checkpoint(out).meta["throughput"]["world_size"] == 2
    # Same micro-batches in the same order: rank r's slice = accumulation step r, bit for bit.
    accum = single(tmp_path, "accum.pt", 6, grad_accum=2)
    for key in ddp:
        assert torch.equal(ddp[key], accum[key]), key
    # One process, one batch of 16: equal to 1e-5. attn.b_K is left out: its gradient is zero
    # in exact arithmetic (a key bias shifts every logit of a row equally), so AdamW turns
    # rounding noise (~1e-9) into lr-sized steps whose sign depends on summation order.
    whole = single(tmp_path, "whole.pt", 6)
    for key in ddp:
        if ddp[key].is_floating_point() and not key.endswith("b_K"):
            torch.testing.assert_close(ddp[key], whole[key], atol=1e-5, rtol=0, msg=key)


def test_torchrun_with_length_groups_splits_each_ranks_rows(tmp_path, torchrun):
    """Each rank groups its own rows by length: two ranks with 2 length groups each equal one
    process accumulating 2 micro-batches of 2 length groups, up to the order of the gradient
    sum ((g1 + g2) + (g3 + g4) across ranks, ((g1 + g2) + g3) + g4 in one process)."""
    out = tmp_path / "ddp.pt"
    proc = torchrun([*RUN, "--steps", "4", "--eval-every", "4", "--length-groups", "2",
                     "--out", str(out)])  # fmt: skip
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, log
    ddp = weights(out)
    accum = single(tmp_path, "accum.pt", 4, grad_accum=2, length_groups=2)
    assert load_checkpoint(out).meta["train_config"]["length_groups"] == 2
    for key in ddp:
        if ddp[key].is_floating_point() and not key.endswith("b_K"):  # b_K: see above
            torch.testing.assert_close(ddp[key], accum[key], atol=1e-6, rtol=0, msg=key)


def test_a_killed_torchrun_resumes_to_the_same_weights(tmp_path, torchrun):
    out = tmp_path / "ddp.pt"
    state = tmp_path / "ddp.pt.state.pt"
    args = [*RUN, "--steps", "300", "--eval-every", "300", "--checkpoint-every", "20"]
    proc = torchrun([*args, "--out", str(out)])
    deadline = time.time() + 240

    def step():  # the training state's step (the first is written at step 0)
        try:
            return torch.load(state, weights_only=True)["step"]
        except (OSError, RuntimeError):
            return 0

    while step() == 0 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    for pid in [proc.pid, *descendants(proc.pid)]:  # the launcher and both ranks, mid-run
        os.kill(pid, signal.SIGKILL)  # (torchrun starts each rank in a session of its own)
    log = proc.communicate()[0]
    assert state.exists() and not out.exists(), log
    step = torch.load(state, weights_only=True)["step"]
    assert 0 < step < 300
    proc = torchrun([*args, "--out", str(out), "--resume"])
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, log
    assert not state.exists()
    resumed, reference = weights(out), single(tmp_path, "ref.pt", 300, grad_accum=2)
    for key in resumed:
        assert torch.equal(resumed[key], reference[key]), key


GRID = dict(
    tasks=["copy:id_lengths=2-4,ood_lengths=5-6", "reverse:id_lengths=2-4,ood_lengths=5-6"],
    pes=["nope", "alibi"],
    seeds=[0],
    preset="tiny",
    eval_n=5,
    log=lambda line: None,
)
STEPS = {"steps": 8, "eval_every": 4, "checkpoint_every": 4}


def deterministic(directory):
    records = {}
    for path in sorted(Path(directory).rglob("record.json")):
        record = json.loads(path.read_text())
        records[record["run"]] = {k: v for k, v in record.items() if k not in NONDETERMINISTIC}
    return records


def test_sweep_interrupted_and_rerun_finishes_each_run_once_and_shards_agree(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    names = {run_name(s) for s in grid(GRID["tasks"], GRID["pes"], GRID["seeds"])}
    assert len(names) == 4
    # interrupted: every run stops after 4 of its 8 steps (state written, no record)
    first = run_sweep(**GRID, out=a, workers=2, overrides={**STEPS, "stop_after": 4})
    assert set(first) == names and set(first.values()) == {"interrupted"}
    assert not list(a.rglob("record.json")) and len(list(a.rglob("*.state.pt"))) == 4
    # the training time saved before the interruption counts in the record's run_wall_s
    state_path = sorted(a.rglob("*.state.pt"))[0]
    state = torch.load(state_path, weights_only=True)
    torch.save({**state, "wall": 1000.0}, state_path)
    second = run_sweep(**GRID, out=a, workers=2, overrides=STEPS)
    assert set(second.values()) == {"finished"}
    record = json.loads((state_path.parent / "record.json").read_text())
    assert 1000 < record["run_wall_s"] < 1000 + 600
    stamps = {p: p.stat().st_mtime_ns for p in a.rglob("record.json")}
    third = run_sweep(**GRID, out=a, workers=2, overrides=STEPS)
    assert set(third.values()) == {"skipped"}
    assert {p: p.stat().st_mtime_ns for p in a.rglob("record.json")} == stamps  # not rewritten
    assert not list(a.rglob("*.state.pt"))
    # stopped after its training ended but before its record: the record comes without a time
    (state_path.parent / "record.json").unlink()
    fourth = run_sweep(**GRID, out=a, workers=2, overrides=STEPS)
    assert sorted(fourth.values()) == ["finished", "skipped", "skipped", "skipped"]
    assert json.loads((state_path.parent / "record.json").read_text())["run_wall_s"] is None
    # two shards, never interrupted, give the same records as the interrupted unsharded sweep
    s0 = run_sweep(**GRID, out=b, shard=(0, 2), overrides=STEPS)
    s1 = run_sweep(**GRID, out=b, shard=(1, 2), overrides=STEPS)
    assert set(s0) | set(s1) == names and not set(s0) & set(s1)
    assert deterministic(a) == deterministic(b)
    record = deterministic(a)["copy.id_lengths=2-4.ood_lengths=5-6-alibi-seed0"]
    assert record["task_options"] == {"id_lengths": [2, 4], "ood_lengths": [5, 6]}
    assert {(r["split"], r["length"]) for r in record["accuracy"]} == {
        ("ID", 2), ("ID", 3), ("ID", 4), ("OOD", 5), ("OOD", 6)}  # fmt: skip
    table = collect(a)
    assert len(table) == 4 * 5 and set(table["pe"]) == {"nope", "alibi"}


def test_sweep_leaves_a_run_another_process_is_training(tmp_path):
    from nopeinterp._io import try_lock

    spec = grid(GRID["tasks"][:1], ["nope"], [0])[0]
    folder = tmp_path / run_name(spec)
    folder.mkdir()
    with try_lock(folder / "model.pt.lock"):
        statuses = run_sweep(**{**GRID, "tasks": GRID["tasks"][:1]}, out=tmp_path, overrides=STEPS)
    assert statuses == {
        run_name(spec): "busy",
        run_name(grid(GRID["tasks"][:1], ["alibi"], [0])[0]): "finished",
    }
    # adding a test set to a finished run takes the lock too: two sweeps decode it once
    only = {**GRID, "tasks": GRID["tasks"][:1], "pes": ["alibi"]}
    run_sweep(**only, out=tmp_path / "b", overrides=STEPS, test="none")
    alibi = tmp_path / "b" / run_name(grid(GRID["tasks"][:1], ["alibi"], [0])[0])
    with try_lock(alibi / "model.pt.lock"):
        statuses = run_sweep(**only, out=tmp_path / "b", overrides=STEPS, test="eval_set")
    assert set(statuses.values()) == {"busy"}
    statuses = run_sweep(**only, out=tmp_path / "b", overrides=STEPS, test="eval_set")
    assert set(statuses.values()) == {"tested"}


def test_task_specs_carry_options():
    assert parse_task_spec("copy") == ("copy", {})
    assert parse_task_spec("copy:variant=rsc,id_lengths=2-20") == (
        "copy", {"variant": "rsc", "id_lengths": (2, 20)})  # fmt: skip
    from nopeinterp.errors import NopeinterpError

    for bad in ("cpy", "copy:variant", "copy:=3"):
        with pytest.raises(NopeinterpError):
            parse_task_spec(bad)


def test_cli_sweep_and_collect(tmp_path, capsys):
    out = tmp_path / "grid"
    args = ["sweep", "--tasks", GRID["tasks"][0], "--pes", "nope", "--seeds", "0", "1"]
    args += ["--preset", "tiny", "--steps", "4", "--eval-n-record", "3", "--out", str(out)]
    assert main(args) == 0
    assert "2 finished" in capsys.readouterr().out
    assert main(["collect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "OOD" in printed and (out / "records.csv").exists()
    assert main([*args[:-2], "--shard", "2/2", "--out", str(out)]) == 2
    assert "bad shard" in capsys.readouterr().err
    assert main(["collect", str(tmp_path / "none")]) == 2


def test_retest_decodes_a_record_again_with_todays_bound_and_keeps_the_earlier_test(tmp_path):
    from nopeinterp.evaluation import DECODE_BOUND
    from nopeinterp.training.sweep import retest

    only = {**GRID, "tasks": GRID["tasks"][:1], "pes": ["nope"]}
    run_sweep(**only, out=tmp_path, overrides=STEPS, test="eval_set")
    (folder,) = [p.parent for p in tmp_path.rglob("record.json")]
    path, ckpt = folder / "record.json", folder / "model.pt"
    record = json.loads(path.read_text())
    assert record["decode_bound"] == DECODE_BOUND
    assert not retest(path, ckpt)  # today's bound already: nothing decoded
    # a record from before the per-item bound: decoded again, the earlier test kept beside it
    old = {k: v for k, v in record.items() if k != "decode_bound"}
    old["ood_accuracy"] = -1.0  # marks the earlier numbers
    path.write_text(json.dumps(old))
    assert retest(path, ckpt)
    new = json.loads(path.read_text())
    assert new["decode_bound"] == DECODE_BOUND and new["previous_test"]["ood_accuracy"] == -1.0
    assert "decode_bound" not in new["previous_test"]
    # an answer-only task: its exact match does not depend on the bound
    assert new["accuracy"] == record["accuracy"]
    assert new["ood_accuracy"] == record["ood_accuracy"]
    with pytest.raises(NopeinterpError, match="no checkpoint"):
        path.write_text(json.dumps(old))
        retest(path, tmp_path / "gone.pt")
