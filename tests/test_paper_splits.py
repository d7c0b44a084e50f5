"""The paper's split family (copy/reverse variants, SCAN mdlen/len), eval sets and bos=False."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from nopeinterp.errors import NopeinterpError
from nopeinterp.tasks import (
    PAPER_SPLITS,
    TaskError,
    encode_examples,
    get_task,
    paper_split,
    task_tokenizer,
    tokenizer_from_json,
    tokenizer_to_json,
)
from nopeinterp.tasks.copy import PAPER_SYMBOLS
from nopeinterp.tasks.scan import all_commands, interpret
from nopeinterp.tasks.tokenizer import adds_bos

COPY_VARIANTS = ("cmc", "cmc2x", "rsc", "rsc2x", "rdc")
REVERSE_VARIANTS = ("mc", "mc2x", "mcrv")


def test_split_table():
    assert list(PAPER_SPLITS) == [*COPY_VARIANTS, *REVERSE_VARIANTS, "mdlen", "len"]
    # The paper's own names, as in its results files (official_ood_accuracy.csv)
    assert paper_split("rsc2x").paper_dataset == "s2s_copy"
    assert paper_split("rsc2x").paper_split == "rsc2x_tr20_ts40"
    assert paper_split("mcrv").paper_dataset == "s2s_reverse"
    assert (paper_split("len").paper_dataset, paper_split("len").paper_split) == (
        "scan",
        "len_tr25_ts48",
    )
    for s in PAPER_SPLITS.values():
        t = s.task()
        assert t.name == s.task_name and t.variant == s.name
        expected = ((1, 25), (26, 48)) if t.name == "scan" else ((2, 20), (21, 40))
        assert (t.id_lengths, t.ood_lengths) == expected
        assert t.bos == (s.name != "len")
    with pytest.raises(TaskError, match="choose one of cmc"):
        paper_split("copy")


def test_paper_symbols():
    assert len(PAPER_SYMBOLS) == len(set(PAPER_SYMBOLS)) == 100
    assert all(len(w.split()) == 1 for w in PAPER_SYMBOLS)
    assert set("0123456789") <= set(PAPER_SYMBOLS)
    # Random splits draw from all 100 (2,000 draws: a missing symbol has odds ~ 100 * e^-20)
    seen = Counter(
        w for ex in get_task("copy", variant="cmc").generate(200) for w in ex.target.split()
    )
    assert set(seen) == set(PAPER_SYMBOLS)
    # The first version (no variant) keeps its 10-letter alphabet: shipped checkpoints use it
    assert get_task("copy").alphabet == tuple("abcdefghij")


def _source(prompt: str, instruction: str) -> list[str]:
    head, sep, rest = prompt.partition(f"{instruction} : ")
    assert head == "" and sep
    assert rest.endswith(" [SEP]")
    return rest.removesuffix(" [SEP]").split()


@pytest.mark.parametrize("variant", COPY_VARIANTS + REVERSE_VARIANTS)
def test_variant_answers(variant):
    task_name = "copy" if variant in COPY_VARIANTS else "reverse"
    task = get_task(task_name, variant=variant)
    vocab = set(task.vocab())
    for split in ("train", "val", "test"):
        for ex in task.generate(40, split=split, seed=3):
            assert set(ex.prompt.split()) | set(ex.target.split()) <= vocab
            if variant == "rdc":
                words = ex.prompt.split()
                assert words[0] == "Replace" and words[2] == "with" and words[4] == "in"
                a, b, seq = words[1], words[3], words[5:-1]
                assert words[-1] == "[SEP]" and a != b and seq == [a] * ex.length
                assert ex.target.split() == [b] * ex.length
                continue
            seq = _source(ex.prompt, "Copy" if task_name == "copy" else "Reverse")
            assert len(seq) == ex.length
            assert set(seq) <= set(PAPER_SYMBOLS)
            rev = seq[::-1]
            expected = {
                "cmc": seq,
                "cmc2x": [*seq, "[NEXT]", *seq],
                "rsc": seq,
                "rsc2x": seq + seq,
                "mc": rev,
                "mc2x": [*rev, "[NEXT]", *rev],
                "mcrv": [*rev, "[NEXT]", *seq],
            }[variant]
            if variant in ("rsc", "rsc2x"):
                assert len(set(seq)) == 1  # one symbol repeated n times
            assert ex.target.split() == expected


def test_scan_variants():
    mdlen, length = get_task("scan", variant="mdlen"), get_task("scan", variant="len")
    # mdlen is the default SCAN task (what the shipped SCAN checkpoints were trained on)
    assert get_task("scan").generate(50, seed=2) == mdlen.generate(50, seed=2)
    for a, b in zip(mdlen.generate(50, seed=2), length.generate(50, seed=2), strict=True):
        assert a.prompt == "Solve : " + b.prompt and a.target == b.target
        cmd = b.prompt.removesuffix(" [SEP]")
        assert cmd in all_commands() and b.target.split() == interpret(cmd)
    assert "Solve" not in length.vocab() and "Solve" in mdlen.vocab()
    # Both variants hold out the same commands for validation
    strip = {e.prompt.removeprefix("Solve : ") for e in mdlen.eval_set("val", n_per_length="all")}
    assert strip == {e.prompt for e in length.eval_set("val", n_per_length="all")}


def test_scan_test_set_is_the_whole_ood_pool():
    ood = sorted(c for c in all_commands() if len(interpret(c)) > 25)
    assert len(ood) == 3136  # the paper's SCAN OOD pool (paper-notes)
    for variant in ("mdlen", "len"):
        test = get_task("scan", variant=variant).eval_set("test")
        cmds = [e.prompt.removeprefix("Solve : ").removesuffix(" [SEP]") for e in test]
        assert sorted(cmds) == ood  # every OOD command exactly once
        assert [e.length for e in test] == sorted(e.length for e in test)
    val = get_task("scan").eval_set("val", n_per_length="all")
    n_id = len(all_commands()) - len(ood)
    assert n_id == 17_774 and 0.08 * n_id < len(val) < 0.12 * n_id  # ~10% held out
    assert len({e.prompt for e in val}) == len(val)
    train = {e.prompt for e in get_task("scan").generate(3000, seed=0)}
    assert not train & {e.prompt for e in val}


@pytest.mark.parametrize("name", list(PAPER_SPLITS))
def test_eval_sets_score_each_item_once(name):
    task = paper_split(name).task()
    for split, lengths in (("test", task.ood_lengths), ("val", task.id_lengths)):
        items = task.eval_set(split, n_per_length=30 if task.name != "scan" else "all")
        prompts = [e.prompt for e in items]
        assert len(prompts) == len(set(prompts)), "an item scored twice"
        assert all(lengths[0] <= e.length <= lengths[1] for e in items)
        if split == "val":
            assert all(task.held_out(e) for e in items)
    if name in ("rsc", "rsc2x"):  # a pool of one item per symbol: taken whole
        test = task.eval_set("test")
        assert len(test) == 100 * 20
        for n in range(21, 41):
            syms = [e.prompt.split()[2] for e in test if e.length == n]
            assert sorted(syms) == sorted(PAPER_SYMBOLS)
    if name == "cmc":
        test = task.eval_set("test")
        assert Counter(e.length for e in test) == {n: task.test_size for n in range(21, 41)}
    assert task.eval_set("test", seed=1) == task.eval_set("test", seed=1)


def test_eval_set_errors():
    with pytest.raises(TaskError, match="cannot be listed"):
        get_task("copy", variant="cmc").eval_set("test", n_per_length="all")
    assert len(get_task("copy", variant="rsc").eval_set("test", n_per_length="all")) == 2000
    with pytest.raises(TaskError):
        get_task("scan").eval_set("train")
    for bad in (0, -1, "some", 2.5):
        with pytest.raises(TaskError):
            get_task("scan").eval_set("test", n_per_length=bad)


def test_bad_options_are_one_line_errors():
    for kwargs in (
        {"variant": "xyz"},
        {"foo": 1},
        {"bos": "no"},
        {"variant": "mc"},  # a reverse variant asked of copy
        {"variant": "cmc", "alphabet": ("Copy", "x")},  # a task word as a symbol
    ):
        with pytest.raises(NopeinterpError):
            get_task("copy", **kwargs)
    with pytest.raises(TaskError, match="mdlen, len"):
        get_task("scan", variant="length")
    with pytest.raises(TaskError, match="unknown task"):
        get_task("copyy")


# ---------------------------------------------------------------- no start token (bos=False)


def test_no_bos_tokenizer_and_encoding():
    task = get_task("scan", variant="len")
    tok = task_tokenizer(task)
    assert not adds_bos(tok)
    ids = tok("jump twice [SEP]")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["jump", "twice", "<sep>"]
    bos_id = tok.convert_tokens_to_ids("<bos>")
    assert bos_id == 1 and tok.bos_token_id is None  # the id stays, unused
    # JSON keeps the choice; a tokenizer with <bos> writes the same JSON as before the option
    s = tokenizer_to_json(tok)
    assert json.loads(s)["bos"] is False and not adds_bos(tokenizer_from_json(s))
    with_bos = task_tokenizer(get_task("scan"))
    assert "bos" not in json.loads(tokenizer_to_json(with_bos))
    assert adds_bos(tokenizer_from_json(tokenizer_to_json(with_bos)))
    exs = task.generate(6, seed=1)
    b = encode_examples(tok, exs)
    for i, ex in enumerate(exs):
        n = int(b.attention_mask[i].sum())
        prompt_ids = tok(ex.prompt, add_special_tokens=False)["input_ids"]
        target_ids = tok(ex.target, add_special_tokens=False)["input_ids"]
        assert b.tokens[i, :n].tolist() == prompt_ids + target_ids + [tok.eos_token_id]
        assert int(b.prompt_lengths[i]) == len(prompt_ids)
        marked = b.target_mask[i].nonzero().flatten().tolist()
        assert marked == list(range(len(prompt_ids) - 1, n - 1))
    assert (b.tokens != bos_id).all()
    # bos=True brings the start token back on the same split (a control)
    control = task_tokenizer(get_task("scan", variant="len", bos=True))
    assert encode_examples(control, exs).tokens[:, 0].eq(control.bos_token_id).all()
    # The option works for any task
    nb = get_task("copy", variant="rsc", bos=False)
    row = encode_examples(task_tokenizer(nb), nb.generate(1)).tokens[0].tolist()
    assert task_tokenizer(nb).convert_ids_to_tokens(row[:2]) == ["Copy", ":"]


def test_no_bos_through_model_training_and_evaluation(tmp_path):
    from nopeinterp.checkpoint import load_checkpoint
    from nopeinterp.evaluation import evaluate, greedy_decode
    from nopeinterp.training.trainer import TrainConfig, train

    out = tmp_path / "len.pt"
    cfg = TrainConfig(
        task="scan",
        pe="nope",
        out=str(out),
        steps=2,
        batch_size=4,
        eval_every=2,
        eval_n=4,
        n_layers=1,
        n_heads=2,
        d_model=16,
        task_options={"variant": "len"},
        progress=False,
    )
    train(cfg)
    ckpt = load_checkpoint(out)
    assert ckpt.meta["task_options"] == {"variant": "len"}
    assert not adds_bos(ckpt.tokenizer)
    model, tok = ckpt.model, ckpt.tokenizer
    toks = model.to_tokens("jump twice [SEP]")  # TransformerLens adds nothing either
    assert tok.convert_ids_to_tokens(toks[0].tolist()) == ["jump", "twice", "<sep>"]
    assert not adds_bos(tok)  # still, after TransformerLens set its bos_token to <eos>
    exs = get_task("scan", variant="len").generate(3)
    enc = encode_examples(tok, exs)
    assert enc.tokens[:, 0].tolist() == [tok(e.prompt)["input_ids"][0] for e in exs]
    assert tok.convert_ids_to_tokens(enc.tokens[0, :1].tolist())[0] == exs[0].prompt.split()[0]
    # greedy decoding sees the same prompt ids as encode_examples (no start token)
    ex = get_task("scan", variant="len").generate(1)[0]
    a = greedy_decode(model, tok, [ex], max_new_tokens=3)
    b = greedy_decode(model, tok, [ex], max_new_tokens=3, use_cache=False)
    assert a == b
    table = evaluate(ckpt, lengths=[26], n=3, progress=False).table
    assert table["n"].tolist() == [3] and table["split"].tolist() == ["OOD"]
    # a second model built from this model's tokenizer (random_init_like, the probes'
    # control) must not go to the Hub for a "bos-enabled" copy
    import transformers

    from nopeinterp.models.fresh import random_init_like

    def no_hub(*args, **kwargs):
        raise AssertionError("AutoTokenizer.from_pretrained called: a Hub fetch")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
        fresh = random_init_like(model, 1)
    assert (
        not adds_bos(fresh.tokenizer)
        and fresh.to_tokens("jump twice")[0].tolist() == toks[0, :2].tolist()
    )
