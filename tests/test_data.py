"""nopeinterp.data (the one way in for data) and the analysis protocol on any HookedTransformer."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from nopeinterp import build_model, save_checkpoint
from nopeinterp._tl import tl_deprecation_silenced
from nopeinterp.data import NOT_READABLE, Sequences, make_sequences, max_positions
from nopeinterp.evaluation import evaluate
from nopeinterp.probing import distance_dependence, probe_position
from nopeinterp.results import Result
from nopeinterp.similarity import compare_attention
from nopeinterp.tasks import get_task, task_tokenizer

TASK_OPTIONS = {"id_lengths": [2, 4], "ood_lengths": [5, 6]}


def _copy_checkpoint(path, pe="nope", seed=0, n_ctx=64, task_options=TASK_OPTIONS):
    tok = task_tokenizer(get_task("copy", **task_options))
    model = build_model(
        pe, n_layers=2, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=n_ctx, seed=seed,
        tokenizer=tok,
    )  # fmt: skip
    return save_checkpoint(model, path, task="copy", task_options=task_options, seed=seed)


def test_sequences_subset_and_cut_keep_the_dropped_count():
    tokens = torch.arange(12).reshape(3, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    s = Sequences(tokens, mask, mask.sum(1), "OOD", {"earlier reason": 2})
    cut = s.readable_by(3)
    assert len(cut) == 2 and cut.tokens.shape == (2, 3)  # padding trimmed
    assert cut.dropped == {"earlier reason": 2, NOT_READABLE: 1}
    sub = cut.subset(torch.tensor([1]))
    assert sub.dropped == cut.dropped and sub.split == "OOD"
    assert s.dropped == {"earlier reason": 2}  # the original is untouched


def test_batches_break_at_task_length_and_batch_size():
    lengths = torch.tensor([2, 2, 2, 3, 3])
    s = Sequences(torch.zeros(5, 4, dtype=torch.long), torch.ones(5, 4, dtype=torch.long), lengths)
    assert [len(b) for b in s.batches(2)] == [2, 1, 2]
    with pytest.raises(ValueError, match="batch_size"):
        next(s.batches(0))


def test_texts_with_a_tokenizer():
    tok = task_tokenizer(get_task("copy"))
    sets = make_sequences(["a b c", "a b"], tokenizer=tok)
    assert list(sets) == ["all"]
    assert sets["all"].attention_mask.sum(1).tolist() == [
        len(tok("a b c")["input_ids"]),
        len(tok("a b")["input_ids"]),
    ]
    with pytest.raises(ValueError, match="tokenizer"):
        make_sequences(["a b"])


def test_compare_attention_default_data_uses_the_checkpoints_task_options(tmp_path):
    # Bug: without data, compare_attention built the task from its name only, so a model
    # trained on lengths 2-4 was compared on copy's default 2-40 with wrong ID/OOD labels.
    a = _copy_checkpoint(tmp_path / "copy-nope.pt")
    b = _copy_checkpoint(tmp_path / "copy-t5.pt", pe="t5")
    result = compare_attention(a, {"t5": b}, n_per_length=1, n_boot=10, progress=False)
    per = result.per_example.drop_duplicates("example")
    assert per["length"].tolist() == [2, 3, 4, 5, 6]
    assert per["split"].tolist() == ["ID", "ID", "ID", "OOD", "OOD"]


def test_probe_meta_counts_sequences_a_learned_table_cannot_read(tmp_path):
    # Bug: the count of sequences dropped for a learned APE was lost on the way to the meta,
    # so its OOD split vanished without a word.
    path = _copy_checkpoint(tmp_path / "copy-ape.pt", pe="ape", n_ctx=12)
    result = probe_position(path, n_train=40, n_eval=10, random_baseline=False, progress=False)
    assert "OOD" not in set(result.table.split)
    assert result.meta["dropped_OOD"] == {NOT_READABLE: 10}


def _stock(pos: str, d_vocab: int) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=2, n_heads=2, d_model=32, d_head=16, d_mlp=64, d_vocab=d_vocab, n_ctx=16,
        act_fn="relu", normalization_type="LN", positional_embedding_type=pos, seed=3,
        **({"rotary_dim": 8} if pos == "rotary" else {}),
    )  # fmt: skip
    with tl_deprecation_silenced():
        return HookedTransformer(cfg)


@pytest.mark.parametrize("pos", ["standard", "rotary"])
def test_all_four_analyses_run_on_stock_transformerlens_models(pos):
    """A HookedTransformer the package did not build: defaults work, including the
    random-init baseline, and sequences past its 16 positions are dropped and counted."""
    task = get_task("copy")  # OOD lengths up to 40: sequences of up to ~83 tokens
    tok = task_tokenizer(task)
    model, other = _stock(pos, len(tok)), _stock(pos, len(tok))
    assert max_positions(model) == 16
    probe = probe_position(model, "copy", n_train=40, n_eval=8, progress=False)
    dist = distance_dependence(model, "copy", n_eval=8, progress=False)
    sim = compare_attention(model, {"other": other}, "copy", n_per_length=1, progress=False)
    ev = evaluate(model, "copy", lengths=[2, 3, 30], n=2, progress=False)
    for result in (probe, dist, sim, ev):
        assert isinstance(result, Result) and len(result.table)
    assert probe.meta["dropped_OOD"] == {NOT_READABLE: 8}
    assert dist.meta["dropped_OOD"] == {NOT_READABLE: 8}
    assert set(probe.table.model) >= {"trained", "random_init"}
    # NoPE's own table cuts the data for everyone: all OOD and the longer ID sequences go
    assert sim.meta["dropped_ID"][NOT_READABLE] > 0 and "OOD" not in set(sim.per_example.split)
    assert ev.table.set_index("length")["evaluable"].to_dict() == {2: True, 3: True, 30: False}
