"""Greedy decoding throughput: KV cache vs re-running the whole sequence (no cache).

200 evaluation ("val" split) examples of the copy task (ID lengths 2..20), a random 4-layer,
4-head, d_model 128 model of each requested PE (default nope) with the task's
tokenizer, decoded by nopeinterp.evaluation.greedy_decode in batches of 64 sorted by prompt
length (as exact_match does). Both paths produce the same tokens (checked here); the time
is the median of repeats. Tokens/s counts generated tokens (decode steps x batch rows;
each row is bounded by its own target + 1 tokens, so a random model that never says <eos>
decodes until the batch's longest row reaches its bound).

This figure has no target of its own; the row's target (cache >= no cache) is a sanity
check that the cache pays for itself at these lengths.

    python -m bench.decode [--quick] [--threads N] [--pe nope rotary ...]
"""

from __future__ import annotations

import argparse

import torch

from bench._common import interleaved_times, machine_line, print_rows, row
from nopeinterp.evaluation import greedy_decode
from nopeinterp.models import build_model
from nopeinterp.tasks import get_task, task_tokenizer

FULL = dict(n=200, n_layers=4, d_model=128, batch=64, repeats=3, id_lengths=None)
QUICK = dict(n=8, n_layers=1, d_model=32, batch=4, repeats=1, id_lengths=(2, 4))


def _batches(examples, batch):
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].prompt.split()))
    return [[examples[i] for i in order[s : s + batch]] for s in range(0, len(order), batch)]


class _StepCounter:
    """Counts the model's forward calls (the prefill + one per further decode step)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.calls += 1


def run(quick: bool = False, pes=("nope",)) -> list[dict]:
    cfg = QUICK if quick else FULL
    task = get_task("copy", **({"id_lengths": cfg["id_lengths"]} if cfg["id_lengths"] else {}))
    tok = task_tokenizer(task)
    examples = task.generate(cfg["n"], split="val", seed=0)
    batches = _batches(examples, cfg["batch"])
    rows = []
    for pe in pes:
        model = build_model(
            pe,
            n_layers=cfg["n_layers"],
            n_heads=4,
            d_model=cfg["d_model"],
            d_vocab=len(tok),
            n_ctx=64,
            seed=0,
            tokenizer=tok,
        )
        counter = _StepCounter(model)
        outputs = {}

        def decode(use_cache, model=model, outputs=outputs):
            outs = []
            for chunk in batches:
                outs += greedy_decode(model, tok, chunk, use_cache=use_cache)
            outputs[use_cache] = outs

        # generated tokens of one full pass: rows x decode steps, per batch (also a warm-up)
        n_tokens = 0
        for chunk in batches:
            before = counter.calls
            greedy_decode(model, tok, chunk, use_cache=True)
            steps = counter.calls - before  # forwards = generated tokens (see greedy_decode)
            limit = 1 + max(
                len(tok(e.target, add_special_tokens=False)["input_ids"]) for e in chunk
            )
            n_tokens += len(chunk) * min(steps, limit)
        t = interleaved_times(
            {"cache": lambda: decode(True), "no_cache": lambda: decode(False)},
            cfg["repeats"],
            warmup=0,  # the counting pass above warmed up both code paths
        )
        same = outputs[True] == outputs[False]
        tps_cache, tps_plain = n_tokens / t["cache"], n_tokens / t["no_cache"]
        ratio = tps_cache / tps_plain
        rows.append(
            row(
                f"greedy decode {pe} {cfg['n_layers']}L d{cfg['d_model']}, {len(examples)} copy "
                "examples: KV cache vs no cache",
                tps_cache,
                tps_plain,
                ratio,
                target=">= 1.0 (sanity)",
                met=ratio >= 1.0,
                unit="tokens/s",
                note=(
                    f"{n_tokens} generated tokens in {len(batches)} batches of <= {cfg['batch']}; "
                    f"cache {t['cache']:.2f} s, no cache {t['no_cache']:.2f} s; "
                    f"outputs identical: {same}"
                ),
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--pe", nargs="*", default=["nope"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine_line())
    print_rows("decode", run(args.quick, tuple(args.pe)))


if __name__ == "__main__":
    main()
