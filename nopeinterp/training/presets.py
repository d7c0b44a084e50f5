"""Named training set-ups: `--preset paper|reference|repro|repro-t5|lm|tiny`. Each is
defined here once.

A preset is a set of `TrainConfig` values; explicit arguments override it
(`make_config(task, pe, out, preset="paper", steps=100)`).

- paper: the paper's model and optimizer (Kazemnejad et al. 2023, official configs): T5's
  decoder (`arch="t5"`: RMS norm, no biases, unscaled attention logits, tied output scaled by
  d_model^-0.5) at T5-base size (12 layers, 12 heads of 64, d_model 768, d_mlp 3072),
  dropout 0.1, AdamW lr 3e-5, weight decay 0.05, 6% warmup then linear decay, 40k steps at
  batch 64, validation every 2,000 steps.
- reference: what the shipped checkpoints/ were trained with (checkpoints/README.md):
  4 layers, 4 heads, d_model 128, AdamW lr 2e-3, batch 32, 1,500 steps (2,500 on SCAN),
  validation and training state every 250 steps, saved in float16.
- repro: the reproduction grid's protocol (analyses/PROTOCOL.md): 4 layers, 8 heads,
  d_model 128, d_mlp 512, unscaled logits, dropout 0.1, AdamW weight decay 0.05, 6% warmup then
  linear decay, 1,500 steps x 64, validation every 150 steps on `task.eval_set("val")` (25 per
  ID length). Its learning rate (1e-3 here) is a placeholder: the protocol's search picks one
  of 3e-4, 1e-3, 3e-3 and every run passes it explicitly (analyses/reproduction.py).
- repro-t5: the repro protocol on the paper's architecture at the paper's head width, sized
  for a CPU: arch t5, 4 layers, 2 heads of 64 (Rotary turns 16 dims, 8 frequencies, as in the
  paper), d_model 128 and d_mlp 512 as repro (so heads x d_head = d_model = 128, the
  attention cost of repro's 8 heads of 16). Learning rate 1e-3, a placeholder as in repro.
- lm: the language-model study's recipe (analyses/PROTOCOL.md, "Protocol of the
  language-model study"), for `--task lm`: 4 layers, 4 heads, d_model 128, d_mlp 512, AdamW lr 1e-3, weight
  decay 0.01, 6% warmup then linear decay, 1,500 steps x 16 chunks (of the task's context),
  validation loss on 64 chunks every 250 steps, training state every 50 steps.
- tiny: a model that trains in seconds on a CPU, for tests and smoke runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nopeinterp.errors import check_choice


@dataclass(frozen=True)
class Preset:
    name: str
    values: dict  # TrainConfig field -> value
    steps_by_task: dict = field(default_factory=dict)  # task -> steps, where it differs

    def for_task(self, task: str) -> dict:
        values = dict(self.values)
        if task in self.steps_by_task:
            values["steps"] = self.steps_by_task[task]
        return values


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "paper",
            dict(
                arch="t5",
                n_layers=12,
                n_heads=12,
                d_head=64,
                d_model=768,
                d_mlp=3072,
                dropout=0.1,
                attn_scale=False,
                lr=3e-5,
                weight_decay=0.05,
                warmup=0.06,
                steps=40_000,
                batch_size=64,
                eval_every=2000,
                checkpoint_every=2000,
            ),
        ),
        Preset(
            "reference",
            dict(
                n_layers=4,
                n_heads=4,
                d_model=128,
                lr=2e-3,
                weight_decay=0.01,
                warmup=0.06,
                steps=1500,
                batch_size=32,
                eval_every=250,
                checkpoint_every=250,
                dtype="float16",
            ),
            steps_by_task={"scan": 2500, "copy": 1500},
        ),
        Preset(
            "repro",
            dict(
                n_layers=4,
                n_heads=8,
                d_model=128,
                d_mlp=512,
                attn_scale=False,
                dropout=0.1,
                lr=1e-3,
                weight_decay=0.05,
                warmup=0.06,
                steps=1500,
                batch_size=64,
                eval_every=150,
                eval_n=25,
                val_set="eval_set",
                checkpoint_every=150,
            ),
        ),
        Preset(
            "lm",
            dict(
                n_layers=4,
                n_heads=4,
                d_model=128,
                d_mlp=512,
                lr=1e-3,
                weight_decay=0.01,
                warmup=0.06,
                steps=1500,
                batch_size=16,
                eval_every=250,
                eval_n=64,
                checkpoint_every=50,
            ),
        ),
        Preset(
            "tiny",
            dict(
                n_layers=1,
                n_heads=2,
                d_model=32,
                steps=30,
                batch_size=16,
                lr=3e-3,
                eval_every=30,
                eval_n=20,
                checkpoint_every=10,
            ),
        ),
    )
}

# repro's protocol on the paper's architecture and head width: only the model changes
PRESETS["repro-t5"] = Preset(
    "repro-t5", {**PRESETS["repro"].values, "arch": "t5", "n_heads": 2, "d_head": 64}
)


def preset_values(name: str | None, task: str) -> dict:
    """The TrainConfig values of preset `name` for `task` ({} for no preset)."""
    if name is None:
        return {}
    return PRESETS[check_choice(name, PRESETS, "preset")].for_task(task)
