"""Training-step cost with `length_groups` (rows grouped by length, padding cut) against the
padded batch, at the reproduction's and the scratchpad study's model (`--preset repro-t5`).

One step = what the trainer does: the task's training batch of the step (batch 64), the
loss of each group with the batch's target-token count as normaliser, backward, clipping and
an AdamW step. Baseline: the same step on the one padded batch (`length_groups=1`), timed
interleaved with it in the same run. Figures: median step seconds and their ratio per task
spec and group count; `padding`: the share of the padded batch's positions that are padding.

    python -m bench.length_groups [--quick] [--threads 1] [--repeats 5] [--groups 2 4 8]
                                  [--specs copy:variant=rsc addition:scratchpad=icovr ...]
"""

from __future__ import annotations

import argparse

import torch

from bench._common import interleaved_times, machine_line, print_rows, row
from nopeinterp.tasks import encode_examples, get_task, task_tokenizer
from nopeinterp.training.trainer import (
    config_model,
    length_groups,
    make_config,
    target_loss,
    train_examples,
)

SPECS = (
    "copy:variant=rsc",
    "reverse:variant=mc",
    "scan:variant=mdlen",
    "addition:scratchpad=none",
    "addition:scratchpad=co",
    "addition:scratchpad=icovr",
    "lego:scratchpad=icor",
)
GROUPS = (2, 4, 8)
QUICK = dict(specs=("copy:variant=rsc",), groups=(2,), repeats=1, small=True)


def _spec(text: str) -> tuple[str, dict]:
    name, _, opts = text.partition(":")
    return name, dict(kv.split("=", 1) for kv in opts.split(",")) if opts else {}


def step_fn(model, optimizer, batch, n_groups: int):
    parts = length_groups(batch, n_groups)
    n_target = int(batch.target_mask.sum())

    def step():
        optimizer.zero_grad(set_to_none=True)
        for part in parts:
            target_loss(model, part, n_target).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def run(quick: bool = False, specs=SPECS, groups=GROUPS, repeats: int = 5) -> list[dict]:
    small = False
    if quick:
        specs, groups, repeats, small = QUICK["specs"], QUICK["groups"], QUICK["repeats"], True
    rows = []
    for text in specs:
        name, options = _spec(text)
        shape = {"n_layers": 1, "d_model": 32, "d_mlp": 64, "d_head": 16} if small else {}
        cfg = make_config(name, "nope", "unused.pt", preset="repro-t5", task_options=options,
                          **shape)  # fmt: skip
        task = get_task(cfg.task, **cfg.task_options)
        tok = task_tokenizer(task)
        batch = encode_examples(tok, train_examples(task, cfg, 0))
        model = config_model(cfg, tok, n_ctx=1024).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        fns = {k: step_fn(model, optimizer, batch, k) for k in (1, *groups)}
        times = interleaved_times(fns, repeats=repeats)
        padding = 1 - float(batch.attention_mask.float().mean())
        for k in groups:
            rows.append(
                row(
                    f"{text}: step, {k} length groups / padded batch",
                    times[k],
                    times[1],
                    times[k] / times[1],
                    unit="s",
                    note=f"padding {padding:.0%} of the padded batch {tuple(batch.tokens.shape)}",
                )  # fmt: skip
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--groups", type=int, nargs="+", default=list(GROUPS))
    p.add_argument("--specs", nargs="+", default=list(SPECS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line())
    rows = run(args.quick, args.specs, args.groups, args.repeats)
    print_rows("length groups against the padded batch", rows)


if __name__ == "__main__":
    main()
