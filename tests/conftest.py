import pytest
import torch

from nopeinterp import build_model, save_checkpoint
from nopeinterp.tasks import get_task, task_tokenizer

TINY = dict(n_layers=2, n_heads=4, d_model=32, d_vocab=24, n_ctx=16)


@pytest.fixture(autouse=True)
def _torch_threads():
    # Small models: thread start-up costs more than it saves on a 2-core CI machine.
    torch.set_num_threads(1)
    yield


@pytest.fixture
def torchrun():
    """start `nopeinterp train ARGS` under torchrun (CPU, gloo, 1 thread a rank):
    torchrun(args, nproc=2, **Popen kwargs) -> the Popen, stdout and stderr merged"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def start(args, nproc=2, **kwargs):
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={nproc}", "-m", "nopeinterp", "train", *args]
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
        )

    return start


@pytest.fixture
def tiny():
    """build a tiny model: tiny(pe, **overrides)"""

    def make(pe, **overrides):
        return build_model(pe, **{**TINY, **overrides})

    return make


# A checkpoint zoo of tiny untrained models on short copy sequences, named as
# nopeinterp.zoo expects: NoPE, NoPE-prime, T5, ALiBi and a learned APE whose table (12 rows)
# holds the ID sequences but not the OOD ones.
TASK_OPTIONS = {"id_lengths": [2, 4], "ood_lengths": [5, 6]}


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpts")
    task = get_task("copy", **TASK_OPTIONS)
    tok = task_tokenizer(task)
    for name, pe, seed in [
        ("nope", "nope", 0),
        ("nope-seed1", "nope", 1),
        ("t5", "t5", 0),
        ("alibi", "alibi", 0),
        ("ape", "ape", 0),
    ]:
        n_ctx = 12 if pe == "ape" else 64  # ID sequences fit in 12 tokens, OOD ones do not
        model = build_model(
            pe,
            n_layers=2,
            n_heads=2,
            d_model=32,
            d_vocab=len(tok),
            n_ctx=n_ctx,
            seed=seed,
            tokenizer=tok,
        )
        save_checkpoint(
            model, directory / f"copy-{name}.pt", task="copy", task_options=TASK_OPTIONS, seed=seed
        )
    return directory


@pytest.fixture
def cli(capsys):
    """`cli(*argv)`: the command line run in this process, as a CompletedProcess (returncode,
    stdout, stderr). An exception escaping main() fails the test, as a traceback would.
    test_cli_errors runs the real command in subprocesses."""
    import subprocess

    from nopeinterp.cli import main

    def run(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    return run
