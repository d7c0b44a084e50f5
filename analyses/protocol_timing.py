"""Per-step training cost and per-item decoding cost at the protocol's model size (PROTOCOL.md).

    python analyses/protocol_timing.py [--splits mdlen cmc2x] [--pes nope t5 ...] [--steps 20]
        [--preset repro-t5]

One torch thread, the preset's model and batch (default `repro`), the current trainer's own
batch and loss functions, AdamW with gradient clipping; the median over steps after the first
4. Reports wall time, process CPU time and the machine's load average before and after: on a
shared machine the CPU time is the better estimate of what the step costs on an idle core. Decoding is timed on up to
256 items of the split's test set with an untrained model (it never stops early at <eos>, so
this is an upper bound). Prints one JSON line per (split, pe). Used only to size the protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from nopeinterp.errors import NopeinterpError
from nopeinterp.evaluation import exact_match
from nopeinterp.tasks import PAPER_SPLITS, encode_examples, task_tokenizer
from nopeinterp.training.presets import PRESETS
from nopeinterp.training.trainer import config_model, make_config, target_loss, train_examples

WARMUP = 4  # steps left out of the medians


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--splits", nargs="+", default=["mdlen", "cmc2x"], choices=list(PAPER_SPLITS))
    p.add_argument("--pes", nargs="+", default=["nope", "t5", "alibi", "rotary", "sinusoidal"])
    p.add_argument("--steps", type=int, default=20, help=f"more than {WARMUP} (warm-up steps)")
    p.add_argument("--preset", default="repro", choices=list(PRESETS))
    args = p.parse_args()
    if args.steps <= WARMUP:
        raise NopeinterpError(f"--steps must be more than {WARMUP}: the first {WARMUP} are warm-up")
    torch.set_num_threads(1)
    for split in args.splits:
        task = PAPER_SPLITS[split].task()
        tok = task_tokenizer(task)
        test = task.eval_set("test")
        sub = test[:: max(1, len(test) // 256)][:256]
        for pe in args.pes:
            opts = PAPER_SPLITS[split].options
            cfg = make_config(task.name, pe, "unused.pt", preset=args.preset, task_options=opts)
            model = config_model(cfg, tok, n_ctx=128)
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
            load_before = os.getloadavg()[0]
            model.train()
            wall, cpu = [], []
            for step in range(args.steps):
                t0, c0 = time.perf_counter(), time.process_time()
                loss = target_loss(model, encode_examples(tok, train_examples(task, cfg, step)))
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            model.eval()
            t0, c0 = time.perf_counter(), time.process_time()
            exact_match(model, tok, task, sub)
            ev_wall, ev_cpu = time.perf_counter() - t0, time.process_time() - c0

            def median(xs):
                xs = sorted(xs[WARMUP:])
                return round(xs[len(xs) // 2], 4)

            print(
                json.dumps(
                    {
                        "split": split,
                        "pe": pe,
                        "preset": args.preset,
                        **{k: getattr(cfg, k) for k in ("arch", "n_layers", "n_heads", "d_head")},
                        "d_model": cfg.d_model,
                        "batch": cfg.batch_size,
                        "step_wall_s": median(wall),
                        "step_cpu_s": median(cpu),
                        "decode_wall_s_per_item": round(ev_wall / len(sub), 5),
                        "decode_cpu_s_per_item": round(ev_cpu / len(sub), 5),
                        "test_items": len(test),
                        "load_avg_1min": [load_before, os.getloadavg()[0]],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    from _common import run_script

    run_script(main)
