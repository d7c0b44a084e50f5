"""Per-step training cost and per-item decoding cost at the protocol's model size (PROTOCOL.md).

    python analyses/protocol_timing.py [--splits mdlen cmc2x] [--pes nope t5 ...] [--steps 20]

One torch thread, the current trainer's own batch and loss functions, AdamW; the median over
steps after the first 4. Reports wall time and process CPU time: on a shared machine the CPU
time is the better estimate of what the step costs on an idle core. Decoding is timed on up to
256 items of the split's test set with an untrained model (it never stops early at <eos>, so
this is an upper bound). Prints one JSON line per (split, pe). Used only to size the protocol.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from nopeinterp.evaluation import exact_match
from nopeinterp.models import build_model
from nopeinterp.tasks import PAPER_SPLITS, task_tokenizer
from nopeinterp.training.trainer import TrainConfig, target_loss, train_batch

SIZE = {"n_layers": 4, "n_heads": 8, "d_model": 128}  # PROTOCOL.md
BATCH = 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--splits", nargs="+", default=["mdlen", "cmc2x"], choices=list(PAPER_SPLITS))
    p.add_argument("--pes", nargs="+", default=["nope", "t5", "alibi", "rotary", "sinusoidal"])
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    for split in args.splits:
        task = PAPER_SPLITS[split].task()
        tok = task_tokenizer(task)
        test = task.eval_set("test")
        sub = test[:: max(1, len(test) // 256)][:256]
        for pe in args.pes:
            cfg = TrainConfig(task=task.name, pe=pe, out="unused", batch_size=BATCH)
            model = build_model(
                pe, **SIZE, d_vocab=len(tok), n_ctx=128, seed=0, attn_scale=False, tokenizer=tok
            )
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
            model.train()
            wall, cpu = [], []
            for step in range(args.steps):
                t0, c0 = time.perf_counter(), time.process_time()
                loss = target_loss(model, train_batch(task, tok, cfg, step))
                opt.zero_grad()
                loss.backward()
                opt.step()
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            model.eval()
            t0, c0 = time.perf_counter(), time.process_time()
            exact_match(model, tok, task, sub)
            ev_wall, ev_cpu = time.perf_counter() - t0, time.process_time() - c0

            def median(xs):
                xs = sorted(xs[4:])
                return round(xs[len(xs) // 2], 4)

            print(
                json.dumps(
                    {
                        "split": split,
                        "pe": pe,
                        **SIZE,
                        "batch": BATCH,
                        "step_wall_s": median(wall),
                        "step_cpu_s": median(cpu),
                        "decode_wall_s_per_item": round(ev_wall / len(sub), 5),
                        "decode_cpu_s_per_item": round(ev_cpu / len(sub), 5),
                        "test_items": len(test),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
