"""Faults a user meets: kill -9 mid-run, a full disk, huge counts, NaN weights, two sweeps at once.

Each test drives the command line (a forked child process where the process must die or hit an OS
limit) on tiny models with a few steps, and checks the outcome: one line on stderr and exit
status 2 for a fault, the previous files intact, and a resumed run equal to one that never
stopped.
"""

import json
import os
import random
import resource
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from nopeinterp import load_checkpoint, save_checkpoint
from nopeinterp.cli import main
from nopeinterp.errors import CheckpointError, NopeinterpError
from nopeinterp.training import make_config, train
from nopeinterp.training.sweep import NONDETERMINISTIC, parse_task_spec, run_sweep

TASK = "copy:id_lengths=2-4,ood_lengths=5-6"
# tiny preset (1 layer, d_model 32), global batch 8; a validation and a state every 5 steps
TRAIN = ["train", "--task", TASK, "--pe", "nope", "--preset", "tiny", "--batch-size", "8"]
TRAIN += ["--eval-every", "5", "--checkpoint-every", "5", "--eval-n", "8"]


class Child:
    """`nopeinterp --quiet ARGS` in a forked child of this process: `cli.main`, the function
    `python -m nopeinterp` runs, with everything it needs already imported, so a child costs
    no interpreter start-up (5-15 s on a loaded 2-core machine, most of these tests' time). A
    real process all the same: it is killed with SIGKILL, holds its own locks, and gets its
    own OS limits (`limit`: RLIMIT_FSIZE in bytes, writes past it fail with EFBIG as on a
    full disk). Popen-like: poll, send_signal, communicate, returncode."""

    def __init__(self, args, logs: Path, limit: int | None = None):
        logs.mkdir(parents=True, exist_ok=True)
        self.out, self.err = (logs / f"{os.getpid()}-{time.time_ns()}.{k}" for k in "oe")
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            rc = 1
            try:
                for fd, path in ((1, self.out), (2, self.err)):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                if limit is not None:
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
                torch.set_num_threads(1)
                rc = main(["--quiet", *args])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig):
        os.kill(self.pid, sig)

    def communicate(self, timeout: float = 300):
        deadline = time.time() + timeout
        while self.poll() is None:
            if time.time() > deadline:
                self.send_signal(signal.SIGKILL)
                raise TimeoutError(f"child {self.pid} ran past {timeout} s")
            time.sleep(0.02)
        return self.out.read_text(), self.err.read_text()


def kill_when(proc, ready, delay: float, timeout: float = 240) -> bool:
    """kill -9 `proc` `delay` seconds after `ready()` holds; False if it ended first."""
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    end = time.time() + delay
    while proc.poll() is None and time.time() < end:
        time.sleep(0.01)
    if proc.poll() is not None:
        _, err = proc.communicate()
        assert proc.returncode == 0, err
        return False
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return True


def weights(path):
    return load_checkpoint(path).model.state_dict()


def reference_run(tmp_path, steps):
    """The same run in this process, never interrupted."""
    cfg = make_config(
        "copy", "nope", tmp_path / "ref.pt", preset="tiny", batch_size=8, steps=steps,
        eval_every=5, checkpoint_every=5, eval_n=8, task_options=parse_task_spec(TASK)[1],
        progress=False,
    )  # fmt: skip
    return weights(train(cfg))


# --- 1. resume from the command line after kill -9 --------------------------------------------
def test_cli_train_killed_at_random_points_resumes_to_the_same_weights(tmp_path, capsys):
    out = tmp_path / "ck.pt"
    steps = 300  # ~50 steps/s here: the kills land mid-run
    args = [*TRAIN, "--steps", str(steps), "--out", str(out)]
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    delays = sorted(rng.uniform(0.0, 1.5) for _ in range(2))
    for delay in delays:  # each try resumes what the previous kill left
        # killed `delay` s after the best checkpoint exists: the case `--resume` must handle.
        # A machine fast enough to finish first gets the try again from scratch with half the
        # delay, so each of the two kills lands mid-run whatever the speed.
        for _ in range(12):
            proc = Child([*args, "--resume"] if out.exists() else args, tmp_path / "logs")
            # killed mid-run only if the training state is still there: a run killed while
            # exiting after its last step has finished (and removed it)
            if kill_when(proc, out.exists, delay) and Path(str(out) + ".state.pt").exists():
                break
            for leftover in tmp_path.glob("ck.pt*"):
                leftover.unlink()
            delay /= 2
        else:
            raise AssertionError(f"every try finished before it was killed (last delay {delay})")
    # without --resume the interrupted run is refused, in one line naming the flag
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume" in err, err
    assert main([*args, "--resume"]) == 0, capsys.readouterr().err
    assert not Path(str(out) + ".state.pt").exists() and not Path(str(out) + ".lock").exists()
    resumed, reference = weights(out), reference_run(tmp_path, steps)
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), (key, delays)
    assert (
        load_checkpoint(out).meta["history"] == load_checkpoint(tmp_path / "ref.pt").meta["history"]
    )


def test_train_prints_no_nan_validation_and_leaves_no_lock(tmp_path, capsys, monkeypatch):
    from nopeinterp.progress import progress
    from nopeinterp.training import trainer

    # a plain progress line at every step (as in a log), validation at step 5
    monkeypatch.setattr(trainer, "progress_bar", lambda **kw: progress(**kw, interval=0))
    assert main([*TRAIN, "--steps", "6", "--out", str(tmp_path / "m.pt")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 6 and all("loss=" in line for line in lines), lines
    assert "val=" not in lines[0] and "val=" in lines[-1]
    assert not any("nan" in line for line in lines), lines
    # the checkpoint and its validation curve; no .lock, no state
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "m.pt.history.json"]


# --- kill -9 at random points of a sweep --------------------------------------------------------
SWEEP = ["sweep", "--tasks", TASK, "--pes", "nope", "alibi", "--seeds", "0", "--preset", "tiny"]
SWEEP += ["--batch-size", "8", "--steps", "10", "--eval-every", "5", "--checkpoint-every", "5"]
SWEEP += ["--eval-n", "8", "--eval-n-record", "4"]


def records(directory) -> dict:
    out = {}
    for path in sorted(Path(directory).rglob("record.json")):
        record = json.loads(path.read_text())
        out[record["run"]] = {k: v for k, v in record.items() if k not in NONDETERMINISTIC}
    return out


def test_sweep_killed_at_random_points_resumes_to_the_same_records(tmp_path, capsys):
    reference = tmp_path / "ref"
    start = time.time()
    assert main([*SWEEP, "--out", str(reference)]) == 0  # a sweep never stopped
    took = time.time() - start
    out = tmp_path / "grid"
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    delays = [rng.uniform(0.0, 0.7 * took) for _ in range(2)]
    killed = []
    for i, delay in enumerate(delays):  # after the first training state exists
        for _ in range(12):
            proc = Child([*SWEEP, "--out", str(out)], tmp_path / "logs")
            was_killed = kill_when(proc, lambda: any(out.rglob("*.state.pt")), delay)
            if was_killed or i > 0:
                break
            # the first sweep must be interrupted: a sweep that finished first is started
            # again from nothing with half the delay, whatever the machine's speed
            shutil.rmtree(out, ignore_errors=True)
            delay /= 2
        killed.append(was_killed)
    assert killed[0], ("every first sweep finished before it was killed", delays)
    assert main([*SWEEP, "--out", str(out)]) == 0, capsys.readouterr().err
    assert not list(out.rglob("*.state.pt")) and not list(out.rglob("*.lock"))
    assert records(out) == records(reference), delays
    for run in records(reference):
        a, b = weights(out / run / "model.pt"), weights(reference / run / "model.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), (run, delays)


# --- 2. a full disk while saving ----------------------------------------------------------------
@pytest.mark.parametrize("command", ["train", "sweep"])
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_files(tmp_path, command):
    out = tmp_path / "run"
    if command == "train":
        args = [*TRAIN, "--steps", "5", "--out", str(out / "m.pt")]
        assert main(args) == 0
        args.append("--overwrite")  # trained again: its first write fails
        kept = out / "m.pt"
        limit = kept.stat().st_size // 2
    else:  # a finished run, then a new one whose first checkpoint write fails
        assert main([a for a in SWEEP if a != "alibi"] + ["--out", str(out)]) == 0
        (record,) = out.rglob("record.json")
        kept = record.with_name("model.pt")
        limit = kept.stat().st_size // 2
        args = [*SWEEP, "--out", str(out)]
    before = kept.read_bytes()
    proc = Child(args, tmp_path / "logs", limit=limit)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "cannot write" in lines[0] and "File too large" in lines[0], lines[0]
    assert kept.read_bytes() == before  # the previous file, whole and loadable
    load_checkpoint(kept)
    assert not list(out.rglob(".*.tmp"))  # no temporary left behind


def test_a_full_disk_error_from_torch_save_names_the_reason(tmp_path, monkeypatch):
    """The writer torch.save is given reports ENOSPC: the error says so (torch itself only
    says 'unexpected pos')."""
    import errno

    from nopeinterp import _io

    real_open = open

    class FullDisk:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def flush(self):
            self.f.flush()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(_io, "open", lambda p, m: FullDisk(real_open(p, m)), raising=False)
    with pytest.raises(_io.OutputError, match=r"m\.pt: cannot write \(No space left on device\)"):
        _io.atomic_write_torch(tmp_path / "m.pt", {"w": torch.zeros(10_000)})
    assert list(tmp_path.iterdir()) == []


# --- 3. counts past what the machine holds -------------------------------------------------------
class TookTooLong(Exception):
    pass


@pytest.fixture
def time_limit():
    """Fail (instead of hanging the suite) when the code under test works for minutes."""

    def alarm(signum, frame):
        raise TookTooLong

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "{ck}", "--n", "1000000000000", "--lengths", "2-3"],
        ["probe-position", "{ck}", "--n-train", "1000000000"],
        ["probe-distance", "{ck}", "--n-eval", "1000000000000"],
        ["compare-attention", "--checkpoints", "{dir}", "--ref", "t5", "--n", "100000000000"],
    ],
)
def test_huge_counts_are_refused_with_the_memory_estimate(ckpt_dir, args, capsys, time_limit):
    args = [a.format(ck=ckpt_dir / "copy-nope.pt", dir=ckpt_dir) for a in args]
    assert main(args) == 2  # refused at once, not after minutes of work
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "sequences of up to" in line and "of memory, more than the" in line, line
    assert "iB available" in line


def test_the_memory_estimate_follows_the_machine(ckpt_dir, monkeypatch):
    from nopeinterp import data
    from nopeinterp.evaluation import evaluate

    evaluate(ckpt_dir / "copy-nope.pt", n=50, lengths=[4], progress=False)
    monkeypatch.setattr(data, "available_memory", lambda: 1000)
    with pytest.raises(NopeinterpError, match="50 sequences of up to .* tokens need about"):
        evaluate(ckpt_dir / "copy-nope.pt", n=50, lengths=[4], progress=False)


# --- 4. non-finite weights and activations -------------------------------------------------------
@pytest.fixture
def nan_checkpoint(ckpt_dir, tmp_path):
    ckpt = load_checkpoint(ckpt_dir / "copy-nope.pt")
    with torch.no_grad():
        ckpt.model.blocks[1].attn.W_Q[0, 0, 0] = float("nan")
    path = tmp_path / "copy-nope.pt"
    save_checkpoint(ckpt.model, path, **{k: ckpt.meta[k] for k in ("task", "task_options")})
    return path


def test_a_nan_checkpoint_is_refused_naming_the_tensor(nan_checkpoint, capsys):
    with pytest.raises(CheckpointError, match=r"weight blocks\.1\.attn\.W_Q holds 1 non-finite"):
        load_checkpoint(nan_checkpoint)
    for command in (["eval"], ["probe-distance"], ["probe-position"], ["info"]):
        assert main([*command, str(nan_checkpoint)]) == 2, command
        captured = capsys.readouterr()
        (line,) = captured.err.strip().splitlines()
        assert "blocks.1.attn.W_Q" in line and "non-finite" in line, line
        assert captured.out == "" or "checkpoint" not in captured.out  # never an empty table


def test_non_finite_weights_or_activations_in_memory_are_one_clear_error(ckpt_dir):
    from nopeinterp.evaluation import evaluate
    from nopeinterp.probing import distance_dependence, probe_position

    ckpt = load_checkpoint(ckpt_dir / "copy-nope.pt")
    with torch.no_grad():
        ckpt.model.blocks[0].mlp.W_in[0, 0] = float("inf")
    for analyse in (evaluate, probe_position, distance_dependence):
        with pytest.raises(NopeinterpError, match=r"blocks\.0\.mlp\.W_in holds non-finite"):
            analyse(ckpt, progress=False)
    # finite weights, an activation that overflows: the analysis names the hook
    ckpt = load_checkpoint(ckpt_dir / "copy-nope.pt")
    ckpt.model.blocks[0].hook_resid_post.add_hook(lambda x, hook: x * float("inf"))
    with pytest.raises(
        NopeinterpError, match=r"non-finite activations .* at blocks\.0\.hook_resid_post"
    ):
        probe_position(ckpt, n_train=32, n_eval=16, progress=False)


# --- 5. two sweeps on one folder -----------------------------------------------------------------
def test_a_second_sweep_arriving_while_a_run_is_recorded_leaves_it(tmp_path, monkeypatch):
    """The second sweep comes while the first decodes the test set (its training lock is
    released by then): it must leave the run, not decode and record it a second time."""
    from nopeinterp.training import sweep

    grid = dict(tasks=[TASK], pes=["nope"], seeds=[0], preset="tiny", eval_n=4)
    steps = {"steps": 5, "eval_every": 5, "batch_size": 8}
    real, seen = sweep._test_fields, []

    def test_fields(*args, **kwargs):
        if not seen:  # a second sweep arrives now
            seen.append(None)
            seen[0] = run_sweep(**grid, out=tmp_path, overrides=steps, log=lambda x: None)
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "_test_fields", test_fields)
    lines = []
    first = run_sweep(**grid, out=tmp_path, overrides=steps, log=lines.append)
    assert list(first.values()) == ["finished"]
    assert list(seen[0].values()) == ["busy"]
    record = json.loads(next(tmp_path.rglob("record.json")).read_text())
    assert record["run_wall_s"] is not None and record["run_wall_s"] > 0


def test_two_concurrent_sweeps_finish_each_run_once(tmp_path, capsys):
    out = tmp_path / "grid"
    other = Child([*SWEEP, "--out", str(out)], tmp_path / "logs")
    deadline = time.time() + 240
    while not out.exists() and other.poll() is None and time.time() < deadline:
        time.sleep(0.02)  # the other sweep has started its first run: start this one
    assert main([*SWEEP, "--out", str(out)]) == 0
    here = capsys.readouterr().out
    there, err = other.communicate(timeout=300)
    assert other.returncode == 0, err
    for run in records(out):
        logs = [line for line in (here + there).splitlines() if line.startswith(f"{run}: ")]
        assert sorted(line.split(": ")[1].split()[0] for line in logs) in (
            ["busy", "finished"], ["finished", "skipped"]
        ), logs  # fmt: skip
    # the sweeps overlapped: one of them found a run the other held
    assert "busy" in here + there, (here, there)
    for path in out.rglob("record.json"):
        assert json.loads(path.read_text())["run_wall_s"] is not None


# --- a report killed midway -------------------------------------------------------------------------
REPORT = ["--n-attention", "1", "--n-probe", "16", "--n-distance", "4", "--n-heads", "4"]


@pytest.fixture(scope="module")
def small_zoo(tmp_path_factory):
    """Three one-layer checkpoints (NoPE, NoPE-prime, T5): a report on them takes seconds."""
    from nopeinterp import build_model
    from nopeinterp.tasks import get_task, task_tokenizer

    directory = tmp_path_factory.mktemp("zoo")
    options = {"id_lengths": [2, 4], "ood_lengths": [5, 6]}
    tok = task_tokenizer(get_task("copy", **options))
    for name, pe, seed in [("nope", "nope", 0), ("nope-seed1", "nope", 1), ("t5", "t5", 0)]:
        model = build_model(
            pe, n_layers=1, n_heads=2, d_model=16, d_vocab=len(tok), n_ctx=64, seed=seed,
            tokenizer=tok,
        )  # fmt: skip
        save_checkpoint(model, directory / f"copy-{name}.pt", task="copy", task_options=options)
    return directory


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_report_killed_at_random_points_leaves_the_previous_report_whole(small_zoo, tmp_path):
    import pandas as pd

    out = tmp_path / "reports" / "main"
    base = ["report", "--checkpoints", str(small_zoo), *REPORT]
    args = [*base, "--out", str(out)]
    start = time.time()
    assert main(["--quiet", *args, "--n", "1"]) == 0
    took = time.time() - start
    previous = snapshot(out)
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    delays = [rng.uniform(0.0, 1.2 * took) for _ in range(3)]
    for n, delay in enumerate(delays, start=2):  # each rerun asks for other counts: other files
        proc = Child([*args, "--n", str(n)], tmp_path / "logs")
        kill_when(proc, lambda: True, delay)
        found = snapshot(out)
        if found != previous:  # killed after its swap (or it finished): then its whole report
            whole = tmp_path / f"whole-{n}"  # what that run writes when left alone
            assert main(["--quiet", *base, "--out", str(whole), "--n", str(n)]) == 0
            assert found == snapshot(whole), (n, delays)  # byte for byte: no mix of two runs
            previous = found
        assert b"</html>" in previous["index.html"]
        for name in previous:
            if name.endswith(".csv"):
                pd.read_csv(out / name)
    assert main(["--quiet", *args, "--n", "1"]) == 0
    # the next finished report removes what the killed ones left beside it
    assert sorted(p.name for p in out.parent.iterdir()) == ["main"], delays
    assert snapshot(out).keys() == previous.keys()
