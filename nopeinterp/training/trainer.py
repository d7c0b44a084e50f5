"""A plain training loop (nanoGPT-style): AdamW, warmup then linear decay, loss on the target.

Determinism: the global batch at step s depends only on (task, seed, s); dropout's random
state is re-seeded from (seed, step, rank) at every step; and torch runs in deterministic-
algorithm mode while training (`runtime.deterministic_algorithms`: at more than one CPU thread
the embedding backward is otherwise order-dependent). So a run resumed from its training state
reaches the same weights (`torch.equal`) as one that never stopped, at any thread count.

Scale: `device` (auto/cpu/cuda/mps), `precision` (autocast in bf16/fp16 over fp32 master
weights, a GradScaler for fp16), `grad_accum` micro-batches per step, and data parallelism
under `torchrun` (DDP): the global batch of `batch_size` examples is cut into
world_size * grad_accum equal micro-batches and rank r takes the r-th group of grad_accum of
them, so every rank's data is a disjoint, deterministic slice and the loss (a sum over target
tokens divided by the global batch's target-token count) is the single-process loss.
Rank 0 alone evaluates and writes files: the training state (weights, optimizer, scaler,
step, best validation) every `checkpoint_every` steps to `<out>.state.pt`, and the model with
the best validation exact match (ID lengths, as the paper selects) to `out`, both atomically,
and every validation so far to `<out>.history.json` (`validation_curve_path`). With
`stop_at_val` set, training ends early once validation has reached it `stop_evals` times in a
row (the schedule stays the one of `steps`).
The `lm` task (`tasks.lm`: next-token prediction on a corpus) trains on chunks of its
context, every next token a target, and keeps the model with the lowest validation loss
(the state's `best_acc` then holds minus that loss: higher is better for both).
A lock on `<out>.lock` refuses a second run on the same `out`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nopeinterp._io import atomic_write, atomic_write_torch, versions
from nopeinterp.checkpoint import save_checkpoint
from nopeinterp.errors import NopeinterpError
from nopeinterp.evaluation import exact_match
from nopeinterp.lm_eval import token_losses
from nopeinterp.models import build_model
from nopeinterp.progress import progress as progress_bar
from nopeinterp.tasks import LM_TASK, encode_examples, get_task, task_tokenizer
from nopeinterp.training.config import VAL_SETS, TrainConfig, _at_least  # noqa: F401
from nopeinterp.training.presets import preset_values
from nopeinterp.training.runtime import (
    Runtime,
    deterministic_algorithms,
    flops_per_token,
    peak_flops,
)

# Settings that do not change what a run computes: a resumed run may differ in these.
RUN_ONLY = ("out", "device", "resume", "progress", "stop_after")


def make_config(task: str, pe: str, out, *, preset: str | None = None, **overrides) -> TrainConfig:
    """TrainConfig from a preset's values (for this task) with `overrides` on top."""
    values = {**preset_values(preset, task), **overrides}
    return TrainConfig(task=task, pe=pe, out=str(out), preset=preset, **values)


def validation_examples(task, cfg: TrainConfig) -> list:
    """The items validation scores (see `TrainConfig.val_set`)."""
    if cfg.val_set == "eval_set":
        return task.eval_set("val", n_per_length=cfg.eval_n)
    return task.generate(cfg.eval_n, seed=cfg.seed, split="val")


def lr_factor(step: int, total: int, warmup_steps: int) -> float:
    """Linear warmup to 1, then linear decay to 0 (polynomial decay of power 1)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total - step) / max(1, total - warmup_steps))


def reached_stop_val(history: list[dict], cfg: TrainConfig) -> bool:
    """Whether the last `cfg.stop_evals` evaluations all reached `cfg.stop_at_val`."""
    last = history[-cfg.stop_evals :]
    return (
        cfg.stop_at_val is not None
        and len(last) == cfg.stop_evals
        and all(h["val_accuracy"] >= cfg.stop_at_val for h in last)
    )


def validation_curve_path(out) -> Path:
    """`<out>.history.json`: every validation of the run so far (written at each one)."""
    out = Path(out)
    return out.with_name(out.name + ".history.json")


def train_examples(task, cfg: TrainConfig, step: int):
    """The global batch of step `step`: a function of (task, seed, step) only."""
    return task.generate(cfg.batch_size, seed=cfg.seed * 1_000_003 + step, split="train")


def micro_batches(batch, rank: int, world_size: int, grad_accum: int) -> list:
    """Rank `rank`'s grad_accum micro-batches: row slices of the encoded global batch."""
    n = world_size * grad_accum
    size = len(batch) // n
    fields = [f.name for f in dataclasses.fields(batch)]
    return [
        type(batch)(**{f: getattr(batch, f)[i * size : (i + 1) * size] for f in fields})
        for i in range(rank * grad_accum, (rank + 1) * grad_accum)
    ]


def length_groups(batch, n: int) -> list:
    """`batch`'s rows in up to `n` groups of similar length (sorted by length, equal counts),
    each cut to its longest row. Rows are right-padded and padding is masked, so the groups'
    summed token losses are the batch's: the same gradient on less padding."""
    if n == 1:
        return [batch]
    lengths = batch.attention_mask.sum(1)
    fields = [f.name for f in dataclasses.fields(batch)]
    groups = []
    for rows in torch.tensor_split(torch.argsort(lengths, stable=True), min(n, len(batch))):
        width = int(lengths[rows].max())
        cut = {f: getattr(batch, f)[rows] for f in fields}
        groups.append(
            type(batch)(**{f: v[:, :width] if v.dim() == 2 else v for f, v in cut.items()})
        )
    return groups


def config_model(cfg: TrainConfig, tokenizer, n_ctx: int):
    """The freshly initialised model a run of `cfg` trains: its PE, shape, dropout and seed,
    with `tokenizer`'s vocabulary and training context `n_ctx` (only a learned APE uses it)."""
    return build_model(
        cfg.pe,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        d_model=cfg.d_model,
        d_mlp=cfg.d_mlp,
        d_head=cfg.d_head,
        arch=cfg.arch,
        d_vocab=len(tokenizer),
        n_ctx=n_ctx,
        seed=cfg.seed,
        attn_scale=cfg.attn_scale,
        tokenizer=tokenizer,
        dropout=cfg.dropout,
        **cfg.pe_options,
    )


def target_loss(model, batch, normalizer: float | None = None) -> torch.Tensor:
    """Cross-entropy on target tokens (and the final <eos>) only; padding never counts.

    The mean over the batch's target tokens, or their sum divided by `normalizer` (the
    global batch's target-token count, so micro-batches add up to the global mean).
    """
    logits = model(batch.tokens, attention_mask=batch.attention_mask)
    mask = batch.target_mask[:, :-1]
    logits, targets = logits[:, :-1][mask], batch.tokens[:, 1:][mask]
    if normalizer is None:
        return F.cross_entropy(logits.float(), targets)
    return F.cross_entropy(logits.float(), targets, reduction="sum") / normalizer


def _read_state(path: Path) -> dict:
    """The training state, read weights-only by the package's one loader (every failure one
    line, naming the file)."""
    from nopeinterp.checkpoint import load_training_state
    from nopeinterp.errors import CheckpointError

    keys = ("config", "model", "optimizer", "scheduler", "step", "best_acc", "history", "wall")
    try:
        return load_training_state(path, required=keys)
    except CheckpointError as e:
        raise NopeinterpError(f"{e}; delete it to start the run over") from None


def config_differences(saved: dict, cfg: TrainConfig) -> list[str]:
    """'key: saved -> now' for every setting (other than RUN_ONLY) that differs."""
    defaults = TrainConfig(task=cfg.task, pe=cfg.pe, out=cfg.out).to_dict()
    now = cfg.to_dict()
    diffs = []
    for key, value in now.items():
        if key in RUN_ONLY:
            continue
        before = saved.get(key, defaults[key])
        if _plain(before) != _plain(value):
            diffs.append(f"{key}: {before!r} -> {value!r}")
    return diffs


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class RunLockedError(NopeinterpError):
    """Another process is training to the same `out` (it holds `<out>.lock`)."""


def _lock(out: Path):
    """An OS lock on <out>.lock (a `HeldLock`), or RunLockedError if another holder has it."""
    from nopeinterp._io import try_lock

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NopeinterpError(
            f"{out.parent}: cannot create the output folder ({e.strerror})"
        ) from None
    if not os.access(out.parent, os.W_OK):
        raise NopeinterpError(f"{out.parent}: not writable")
    lock = try_lock(str(out) + ".lock")
    if lock is None:
        raise RunLockedError(
            f"{out}: another training run is writing this file (lock {out}.lock held); "
            "wait for it or choose another --out"
        )
    return lock


def train(config: TrainConfig, *, lock: bool = True) -> Path:
    """Train one model; returns the path of the best checkpoint (`config.out`).

    Under torchrun (WORLD_SIZE > 1) every rank calls this; rank 0 writes the files.
    `lock=False`: the caller already holds the run's lock (`_lock(out)`), as a sweep does
    from the start of a run to its record.
    """
    config.validate()
    rt = Runtime.start(config.device, config.precision)
    held = None
    try:
        error = None
        if rt.is_main and lock:
            try:
                held = _lock(Path(config.out))
            except NopeinterpError as e:
                error = (type(e) is RunLockedError, str(e))
        error = rt.broadcast(error)
        if error:
            raise (RunLockedError if error[0] else NopeinterpError)(error[1])
        devices = [rt.device] if rt.device.type == "cuda" else []
        with deterministic_algorithms(rt.device), torch.random.fork_rng(devices=devices):
            return _train(config, rt)
    finally:
        if held is not None:
            held.release()
        rt.stop()


def _train(cfg: TrainConfig, rt: Runtime) -> Path:
    out = Path(cfg.out)
    state_path = out.with_name(out.name + ".state.pt")
    curve_path = validation_curve_path(out)
    if cfg.batch_size % (rt.world_size * cfg.grad_accum):
        raise NopeinterpError(
            f"batch_size={cfg.batch_size} is not divisible by world_size*grad_accum="
            f"{rt.world_size}*{cfg.grad_accum}"
        )
    state = None
    if cfg.resume and state_path.exists():
        state = _read_state(state_path)
        diffs = config_differences(state["config"], cfg)
        if diffs:
            raise NopeinterpError(
                f"{state_path}: not resuming, the run was started with other settings "
                f"({'; '.join(diffs)}); use the same settings or delete the state to start over"
            )
    elif cfg.resume and out.exists():
        raise NopeinterpError(f"{out} exists and has no training state: that run already finished")
    elif not cfg.resume and rt.is_main:
        state_path.unlink(missing_ok=True)  # starting over: an older run's state would mislead
    task = get_task(cfg.task, **cfg.task_options)
    lm = cfg.task == LM_TASK
    if lm:  # chunks of the corpus: the context is the longest sequence
        tokenizer, n_ctx = task.tokenizer(), task.context
        val_examples = task.val_batch(cfg.eval_n)
        task_meta = {"context": task.context, "corpus_tokens": task.token_counts()}
    else:
        tokenizer = task_tokenizer(task)
        val_examples = validation_examples(task, cfg)
        # n_ctx: the longest ID sequence, what a learned APE table must cover (only APE uses
        # it). Measured on many samples at the longest ID length plus the validation set.
        longest = task.generate(1000, lengths=task.id_lengths[1], seed=cfg.seed, split="train")
        batch = encode_examples(tokenizer, [*longest, *val_examples])
        n_ctx = int(batch.attention_mask.sum(1).max()) + 2
        task_meta = {
            "train_lengths": list(task.id_lengths),
            "ood_lengths": list(task.ood_lengths),
        }
    model = config_model(cfg, tokenizer, n_ctx)
    if rt.device.type != "cpu":  # built on the CPU (same weights on every device), then moved
        model.to(rt.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup_steps = max(1, round(cfg.warmup * cfg.steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.steps, warmup_steps)
    )
    scaler = rt.grad_scaler()
    start, best_acc, history, wall = 0, -math.inf, [], 0.0
    if state is not None:
        model.load_state_dict(state["model"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        start, best_acc, history, wall = (
            state["step"],
            state["best_acc"],
            state["history"],
            state["wall"],
        )
    n_params = sum(p.numel() for p in model.parameters())
    peak = peak_flops(rt.device, cfg.precision)
    speed = {"device": str(rt.device), "precision": cfg.precision, "world_size": rt.world_size}

    def save_state(step):
        snapshot = {
            "config": cfg.to_dict(),
            "model": {
                k: v.cpu()
                for k, v in model.state_dict().items()
                if not k.endswith(("rotary_sin", "rotary_cos"))
            },
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else {},
            "step": step,
            "best_acc": best_acc,
            "history": history,
            "wall": wall,
        }
        atomic_write_torch(state_path, snapshot)

    def save_best(step, scores):
        save_checkpoint(
            model,
            out,
            tokenizer=tokenizer,
            dtype=torch.float16 if cfg.dtype == "float16" else None,
            task=cfg.task,
            task_options=task.options  # lm: the corpus as an absolute path, all defaults
            if lm
            else {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.task_options.items()},
            seed=cfg.seed,
            step=step,
            steps=cfg.steps,
            **task_meta,
            **scores,  # val_accuracy (exact match), or val_loss for lm
            val_items=len(val_examples),
            history=list(history),  # loss and the validation score at each evaluation so far
            wall_time_s=round(wall, 1),
            train_config={k: v for k, v in cfg.to_dict().items() if k not in RUN_ONLY},
            throughput=dict(speed),
            versions=versions(),
        )

    if state is None and rt.is_main:
        # a state from the first step on: a run killed at any point (even between writing its
        # best checkpoint and its next state) resumes from `--resume`
        save_state(0)
    train_model = model
    if rt.distributed:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(
            model, device_ids=[rt.device] if rt.device.type == "cuda" else None
        )
    bar = progress_bar(
        total=cfg.steps,
        initial=start,
        desc=f"{cfg.task}/{cfg.pe}",
        disable=not (cfg.progress and rt.is_main),
    )
    val_key = "val_loss" if lm else "val_accuracy"
    last_val = history[-1][val_key] if history else float("nan")
    tokens_seen, train_time, stopped, reached = 0, 0.0, False, False
    model.train()
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        torch.manual_seed((cfg.seed * 1_000_003 + step) * 1024 + rt.rank)  # dropout masks
        if lm:
            batch = task.train_batch(cfg.batch_size, cfg.seed, step)
        else:
            batch = encode_examples(tokenizer, train_examples(task, cfg, step))
        n_target = int(batch.target_mask.sum())
        chunks = [
            group
            for chunk in micro_batches(batch, rt.rank, rt.world_size, cfg.grad_accum)
            for group in length_groups(chunk, cfg.length_groups)
        ]
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=rt.device)
        for i, chunk in enumerate(chunks):
            chunk = chunk.to(rt.device)
            sync = not rt.distributed or i == len(chunks) - 1
            with contextlib.nullcontext() if sync else train_model.no_sync():
                with rt.autocast():
                    # DDP averages gradients over ranks: scale up so they add up instead.
                    loss = target_loss(train_model, chunk, n_target) * rt.world_size
                scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if rt.distributed:  # for the progress bar and history only: the global batch's loss
            torch.distributed.all_reduce(loss_sum)
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        rt.synchronize()
        step_time = time.perf_counter() - t0
        wall += step_time
        train_time += step_time
        tokens_seen += int(batch.attention_mask.sum())
        done = step + 1
        tok_s = tokens_seen / max(train_time, 1e-9)
        speed["tokens_per_s"] = round(tok_s, 1)
        speed["steps_per_s"] = round((done - start) / max(train_time, 1e-9), 4)
        seq_len = float(batch.attention_mask.sum(1).float().mean())
        fpt = flops_per_token(n_params, cfg.n_layers, cfg.d_model, seq_len)
        speed["mfu"] = round(fpt * tok_s / (peak * rt.world_size), 4) if peak else None
        if rt.is_main and (done % cfg.eval_every == 0 or done == cfg.steps):
            model.eval()
            t0 = time.perf_counter()
            with rt.autocast():
                if lm:
                    last_val = float(token_losses(model, val_examples.tokens).double().mean())
                    score = -last_val
                else:
                    correct = exact_match(model, tokenizer, task, val_examples)
                    last_val = score = sum(correct) / len(val_examples)
            wall += time.perf_counter() - t0
            model.train()
            loss_value = float(loss_sum) / rt.world_size
            history.append({"step": done, "loss": loss_value, val_key: last_val})
            if score > best_acc:
                best_acc = score
                save_best(done, {val_key: last_val})
            reached = reached_stop_val(history, cfg)  # never for lm (refused by validate)
            # every evaluation so far (the checkpoint's meta stops at the best one)
            early = reached and done < cfg.steps
            curve = json.dumps({"steps": cfg.steps, "history": history, "stopped_early": early})
            atomic_write(curve_path, lambda t, text=curve: Path(t).write_text(text))
        if cfg.stop_at_val is not None and (done % cfg.eval_every == 0 or done == cfg.steps):
            reached = rt.broadcast(reached)  # every rank finishes at the same step
        stopped = cfg.stop_after is not None and cfg.stop_after <= done < cfg.steps
        stopped = stopped and not reached
        if (
            rt.is_main
            and (done % cfg.checkpoint_every == 0 or stopped)
            and done < cfg.steps
            and not reached
        ):
            save_state(done)
        postfix = {"loss": f"{float(loss_sum) / rt.world_size:.3f}", "tok_s": f"{tok_s:.0f}"}
        if speed["mfu"] is not None:
            postfix["mfu"] = f"{speed['mfu']:.1%}"
        if not math.isnan(last_val):  # no validation yet: nothing to show
            postfix["val"] = f"{last_val:.2f}"
        bar.set_postfix(**postfix)
        bar.update(1)
        if stopped or reached:
            break
    bar.close()
    model.eval()
    rt.barrier()
    if rt.is_main and not stopped:
        state_path.unlink(missing_ok=True)  # finished: the best checkpoint is what remains
    return out
