"""A plain training loop (nanoGPT-style): AdamW, warmup then linear decay, loss on the target.

Determinism: the batch at step s depends only on (task, seed, s), and nothing else in the
loop is random, so a run resumed from its training state reaches the same weights as one
that never stopped. The state (weights, optimizer, step, best validation) is written every
`checkpoint_every` steps to `<out>.state.pt`, atomically; the model with the best validation
accuracy so far (exact match on ID lengths, as the paper selects) is written to `out`.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from nopeinterp.checkpoint import _atomic_write, save_checkpoint
from nopeinterp.errors import NopeinterpError
from nopeinterp.evaluation import exact_match
from nopeinterp.models import build_model
from nopeinterp.progress import progress as progress_bar
from nopeinterp.tasks import encode_examples, get_task, task_tokenizer


@dataclass
class TrainConfig:
    task: str
    pe: str
    out: str
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    warmup: float = 0.06  # fraction of steps, as the paper
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    d_mlp: int | None = None
    attn_scale: bool = True
    pe_options: dict = field(default_factory=dict)
    task_options: dict = field(default_factory=dict)  # e.g. {"id_lengths": [2, 10]}
    eval_every: int = 250
    eval_n: int = 100
    checkpoint_every: int = 250
    dtype: str = "float32"  # of the saved best checkpoint: float32 or float16
    resume: bool = False
    progress: bool = True
    stop_after: int | None = None  # stop (as if interrupted) after this step; for tests

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def lr_factor(step: int, total: int, warmup_steps: int) -> float:
    """Linear warmup to 1, then linear decay to 0 (polynomial decay of power 1)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total - step) / max(1, total - warmup_steps))


def train_batch(task, tokenizer, cfg: TrainConfig, step: int):
    examples = task.generate(cfg.batch_size, seed=cfg.seed * 1_000_003 + step, split="train")
    return encode_examples(tokenizer, examples)


def target_loss(model, batch) -> torch.Tensor:
    """Cross-entropy on target tokens (and the final <eos>) only; padding never counts."""
    logits = model(batch.tokens, attention_mask=batch.attention_mask)
    mask = batch.target_mask[:, :-1]
    return F.cross_entropy(logits[:, :-1][mask], batch.tokens[:, 1:][mask])


def _versions() -> dict:
    import transformer_lens

    import nopeinterp

    return {
        "nopeinterp": nopeinterp.__version__,
        "torch": str(torch.__version__),
        "transformer_lens": str(getattr(transformer_lens, "__version__", "unknown")),
        "python": platform.python_version(),
    }


def train(config: TrainConfig) -> Path:
    """Train one model; returns the path of the best checkpoint (`config.out`)."""
    cfg = config
    out = Path(cfg.out)
    state_path = out.with_name(out.name + ".state.pt")
    task = get_task(cfg.task, **cfg.task_options)
    tokenizer = task_tokenizer(task)
    val_examples = task.generate(cfg.eval_n, seed=cfg.seed, split="val")
    # n_ctx: the longest ID sequence, what a learned APE table must cover (only APE uses it).
    # Measured on many samples at the longest ID length plus the validation set itself.
    longest = task.generate(1000, lengths=task.id_lengths[1], seed=cfg.seed, split="train")
    n_ctx = (
        int(encode_examples(tokenizer, [*longest, *val_examples]).attention_mask.sum(1).max()) + 2
    )
    model = build_model(
        cfg.pe,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        d_model=cfg.d_model,
        d_mlp=cfg.d_mlp,
        d_vocab=len(tokenizer),
        n_ctx=n_ctx,
        seed=cfg.seed,
        attn_scale=cfg.attn_scale,
        tokenizer=tokenizer,
        **cfg.pe_options,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup_steps = max(1, round(cfg.warmup * cfg.steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.steps, warmup_steps)
    )
    start, best_acc, history, wall = 0, -1.0, [], 0.0
    if cfg.resume and state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=True)
        if state["config"]["task"] != cfg.task or state["config"]["pe"] != cfg.pe:
            raise NopeinterpError(f"{state_path}: state is for another task/PE; not resuming")
        model.load_state_dict(state["model"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start, best_acc, history, wall = (
            state["step"],
            state["best_acc"],
            state["history"],
            state["wall"],
        )
    elif cfg.resume and out.exists():
        raise NopeinterpError(f"{out} exists and has no training state: that run already finished")

    def save_state(step):
        state = {
            "config": cfg.to_dict(),
            "model": {
                k: v
                for k, v in model.state_dict().items()
                if not k.endswith(("rotary_sin", "rotary_cos"))
            },
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "best_acc": best_acc,
            "history": history,
            "wall": wall,
        }
        _atomic_write(state_path, lambda t: torch.save(state, t))

    def save_best(step, val_acc):
        save_checkpoint(
            model,
            out,
            tokenizer=tokenizer,
            dtype=torch.float16 if cfg.dtype == "float16" else None,
            task=cfg.task,
            task_options={
                k: list(v) if isinstance(v, tuple) else v for k, v in cfg.task_options.items()
            },
            seed=cfg.seed,
            step=step,
            steps=cfg.steps,
            train_lengths=list(task.id_lengths),
            ood_lengths=list(task.ood_lengths),
            val_accuracy=val_acc,
            wall_time_s=round(wall, 1),
            train_config={
                k: v
                for k, v in cfg.to_dict().items()
                if k not in ("resume", "progress", "stop_after")
            },
            versions=_versions(),
        )

    bar = progress_bar(
        total=cfg.steps, initial=start, desc=f"{cfg.task}/{cfg.pe}", disable=not cfg.progress
    )
    last_val = history[-1]["val_accuracy"] if history else float("nan")
    tokens_seen, t_window = 0, time.perf_counter()
    model.train()
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        batch = train_batch(task, tokenizer, cfg, step)
        loss = target_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        wall += time.perf_counter() - t0
        tokens_seen += int(batch.attention_mask.sum())
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            model.eval()
            t0 = time.perf_counter()
            val_acc = sum(exact_match(model, tokenizer, task, val_examples)) / len(val_examples)
            wall += time.perf_counter() - t0
            model.train()
            history.append({"step": done, "loss": loss.item(), "val_accuracy": val_acc})
            last_val = val_acc
            if val_acc > best_acc:
                best_acc = val_acc
                save_best(done, val_acc)
        if done % cfg.checkpoint_every == 0 and done < cfg.steps:
            save_state(done)
        elapsed = time.perf_counter() - t_window
        bar.set_postfix(
            loss=f"{loss.item():.3f}",
            tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}",
            val=f"{last_val:.2f}",
        )
        bar.update(1)
        if cfg.stop_after is not None and done >= cfg.stop_after and done < cfg.steps:
            save_state(done)
            bar.close()
            return out
    bar.close()
    model.eval()
    state_path.unlink(missing_ok=True)  # finished: the best checkpoint is what remains
    return out
