"""Where a model looks while it writes a scratchpad: attention mass by region of the sequence.

For each generated token, the attention row of the position that predicts it (the token
before it) is summed over the regions its keys fall in: the start token, the prompt, each
scratchpad component (input, computation, output, variables, remaining), the scratchpad's
markers (opening and closing words, component markers, step separators) and the earlier words
of the final answer. Rows are grouped by the region of the generated token itself, so "while
writing outputs, layer 1 puts 40% of its mass on the inputs" reads off one cell.

Regions come from `tasks.scratchpad.label_words`, which reads any text (a model's own
generation included), so the analysis runs on what the model generated greedily
(`tokens="generated"`, the default) or on the gold targets teacher-forced (`tokens="gold"`).
A task without a scratchpad gives only start / prompt / answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch

from nopeinterp.data import Sequences, max_positions, task_examples, task_lengths
from nopeinterp.evaluation import greedy_answers, model_and_task
from nopeinterp.inputs import ModelInput
from nopeinterp.options import RegionOptions, layer_list
from nopeinterp.probing._stream import attention_batches, row_blocks
from nopeinterp.results import Result
from nopeinterp.tasks.scratchpad import PROMPT, REGIONS, START, label_words
from nopeinterp.tasks.tokenizer import adds_bos


@dataclass(repr=False)
class RegionResult(Result):
    """Attention mass per (model, split, layer, head, query_region, key_region).

    `mass`: mean over the generated tokens of that region of the attention their predicting
    row puts on keys of `key_region` (a row's masses add up to 1 over key regions);
    `n_queries`: how many generated tokens the mean is over. `by_layer`: the same averaged
    over heads, one row per (model, pe, split, layer, query_region, key_region).
    """

    name: ClassVar[str] = "attention_regions"
    title: ClassVar[str] = "Attention mass by region while generating"
    extra_tables: ClassVar[tuple[str, ...]] = ("by_layer",)

    @property
    def by_layer(self) -> pd.DataFrame:
        keys = ["model", "pe", "split", "layer", "query_region", "key_region"]
        g = self.table.groupby(keys, sort=False)
        return g.agg(mass=("mass", "mean"), n_queries=("n_queries", "first")).reset_index()

    def pivot(self) -> pd.DataFrame:
        """(model, split, layer, query_region) x key_region: mean mass over heads."""
        p = self.by_layer.pivot_table(
            index=["model", "split", "layer", "query_region"],
            columns="key_region",
            values="mass",
            sort=False,
        )
        return p[[r for r in REGIONS if r in p.columns]]

    @classmethod
    def concat(cls, results) -> RegionResult:
        """Several models' results as one (their tables stacked)."""
        results = list(results)
        meta = {"title": cls.title, "models": [r.meta.get("model") for r in results]}
        return cls(pd.concat([r.table for r in results], ignore_index=True), meta)


def _sequences(task, tokenizer, examples, answers, split, limit):
    """(Sequences, region ids [B, T] (-1 on padding), first generated position per row,
    dropped count): <bos> prompt answer, the answer's words labelled by region."""
    start = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []
    rows, labels, firsts = [], [], []
    dropped = 0
    prompts = tokenizer([ex.prompt for ex in examples], add_special_tokens=False)["input_ids"]
    for prompt_ids, answer in zip(prompts, answers, strict=True):
        words = answer.split()
        ids = tokenizer(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
        if len(ids) != len(words):  # a word the tokenizer splits: cannot be labelled
            raise ValueError(f"answer words do not map one to one onto tokens: {answer!r}")
        row = [*start, *prompt_ids, *ids]
        if not ids or (limit is not None and len(row) > limit):
            dropped += 1
            continue
        lab = (
            [START] * len(start) + [PROMPT] * len(prompt_ids) + label_words(words, task.scratchpad)
        )
        rows.append(row)
        labels.append([REGIONS.index(x) for x in lab])
        firsts.append(len(start) + len(prompt_ids))
    if not rows:
        return None, None, None, dropped
    width = max(map(len, rows))
    tokens = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    region = torch.tensor([r + [-1] * (width - len(r)) for r in labels])
    mask = (region >= 0).long()
    s = Sequences(tokens, mask, mask.sum(1), split)
    return s, region, torch.tensor(firsts), dropped


def attention_regions(
    model, data=None, *, options: RegionOptions | None = None, **changes
) -> RegionResult:
    """Attention mass by region for each generated token, per layer and head (module doc).

    `model`: a hooked model (ours, `from_hf`, a TL model), a Checkpoint or a checkpoint path; `data`: the task (None:
    the checkpoint's own, with its scratchpad format). Options
    (`nopeinterp.options.RegionOptions`), as `options=` or any of its fields: `lengths`
    (default the task's ID and OOD ranges), `n` examples per length (drawn as `evaluate` draws
    them, so none was trained on), `tokens` ("generated": greedy, or "gold": the targets,
    teacher-forced), `layers` (blocks; default all). Memory: a batch's attention is read in
    blocks of query rows.
    """
    opts = RegionOptions.make(options, **changes)
    mi, task, tokenizer = model_and_task(model, data, opts.name, device=opts.device)
    return run_attention_regions(mi, task, tokenizer, opts)


def run_attention_regions(mi: ModelInput, task, tokenizer, opts: RegionOptions) -> RegionResult:
    """Attention regions of `mi` on `task` (resolved), as `attention_regions` describes."""
    tokens, n, seed, batch_size = opts.tokens, opts.n, opts.seed, opts.batch_size
    net = mi.model
    if isinstance(net, torch.nn.Module):
        net.eval()
    n_layers, H = net.cfg.n_layers, net.cfg.n_heads
    layers = layer_list(opts.layers, 0, n_layers - 1, " (the model's layers)")
    lengths = task_lengths(task) if opts.lengths is None else list(opts.lengths)
    limit = max_positions(net)
    R = len(REGIONS)
    by_split: dict[str, list] = {}
    for length in lengths:
        if not task.has_length(length):
            continue
        split, examples = task_examples(task, length, n, seed=seed)
        if examples:
            by_split.setdefault(split, []).extend(examples)
    if not by_split:
        raise ValueError(f"no examples for lengths {lengths} of task {task.name}")
    rows, dropped = [], {}
    for split, examples in by_split.items():
        if tokens == "generated":
            answers = greedy_answers(net, tokenizer, examples, task=task, batch_size=batch_size)
        else:
            answers = [ex.target for ex in examples]
        s, region, firsts, n_out = _sequences(task, tokenizer, examples, answers, split, limit)
        dropped[split] = n_out
        if s is None:
            continue
        sums = torch.zeros(n_layers, H, R, R, dtype=torch.float64)
        counts = torch.zeros(R, dtype=torch.float64)
        for idx, mask, attention, group in attention_batches(
            net,
            s,
            layers,
            batch_size=batch_size,
            scores=False,
            progress=opts.progress,
            desc=f"regions {mi.name}: {split}",
        ):
            t = mask.shape[1]
            reg = region[idx, :t]
            onehot = torch.nn.functional.one_hot(reg.clamp(min=0), R).double()
            onehot *= (reg >= 0)[..., None]
            # query q predicts token q + 1: a generated token when first <= q + 1 < length
            nxt = torch.cat([reg[:, 1:], torch.full_like(reg[:, :1], -1)], 1)
            pos = torch.arange(t)[None, :]
            is_query = (pos + 1 >= firsts[idx][:, None]) & (nxt >= 0)
            q_onehot = torch.nn.functional.one_hot(nxt.clamp(min=0), R).double()
            q_onehot *= is_query[..., None]
            if group[0] == layers[0]:
                counts += q_onehot.sum((0, 1))
            for layer in group:
                for r0, r1 in row_blocks(len(idx), H, t):
                    _, pattern = attention.rows(layer, r0, r1)  # [b, H, r1 - r0, r1]
                    mass = torch.einsum("bhqk,bkr->bhqr", pattern.double().cpu(), onehot[:, :r1])
                    sums[layer] += torch.einsum("bhqr,bqs->hsr", mass, q_onehot[:, r0:r1])
                del pattern, mass
                attention.release(layer)
            del attention
        pe = mi.meta.get("pe", getattr(net, "pe", None))
        for layer in layers:
            for h in range(H):
                for qi, qr in enumerate(REGIONS):
                    if counts[qi] == 0:
                        continue
                    for ki, kr in enumerate(REGIONS):
                        rows.append(
                            {
                                "model": mi.name,
                                "pe": pe,
                                "task": task.name,
                                "scratchpad": task.scratchpad or "none",
                                "split": split,
                                "layer": layer,
                                "head": h,
                                "query_region": qr,
                                "key_region": kr,
                                "mass": float(sums[layer, h, qi, ki] / counts[qi]),
                                "n_queries": int(counts[qi]),
                            }
                        )
    if not rows:
        raise ValueError("no sequence this model can read")
    meta = {
        "title": opts.title or f"Attention mass by region while generating: {mi.name}",
        "model": mi.name,
        "task": task.name,
        "scratchpad": task.scratchpad or "none",
        "tokens": tokens,
        "n": n,
        "seed": seed,
        "lengths": lengths,
        "dropped_past_position_table": dropped,
    }
    return RegionResult(pd.DataFrame(rows), meta)
