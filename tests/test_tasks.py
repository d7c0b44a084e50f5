"""Tests for nopeinterp.tasks: generators, SCAN grammar, tokenizer, encoding."""

from __future__ import annotations

import json
import random
import re
import warnings

import pytest
import torch

from nopeinterp.tasks import (
    TASKS,
    Batch,
    Example,
    build_tokenizer,
    decode_answer,
    encode_examples,
    get_task,
    task_tokenizer,
    tokenizer_from_json,
    tokenizer_to_json,
)
from nopeinterp.tasks.base import is_held_out
from nopeinterp.tasks.scan import all_commands, commands_by_length, interpret

N = 60  # examples per split in the per-task tests; keeps the file fast


@pytest.fixture(scope="module", params=TASKS)
def task(request):
    return get_task(request.param)


# ---------------------------------------------------------------- generic task behaviour


def test_registry():
    assert len(TASKS) == 9
    for name in TASKS:
        assert get_task(name).name == name
    with pytest.raises(ValueError, match="copy, reverse"):
        get_task("nope")
    t = get_task("copy", id_lengths=(3, 5), ood_lengths=(6, 7))
    assert t.split_lengths("train") == range(3, 6)
    assert t.split_lengths("test") == range(6, 8)
    assert all(3 <= ex.length <= 5 for ex in t.generate(20))
    with pytest.raises(ValueError):
        get_task("lego", ood_lengths=(9, 30))  # only 26 variable names


def test_paper_length_defaults():
    expected = {
        "copy": ((2, 20), (21, 40)),
        "reverse": ((2, 20), (21, 40)),
        "scan": ((1, 25), (26, 48)),
    }
    for name in TASKS:
        t = get_task(name)
        assert (t.id_lengths, t.ood_lengths) == expected.get(name, ((1, 8), (9, 16)))


def test_determinism(task):
    a = task.generate(20, seed=3)
    assert a == task.generate(20, seed=3)
    assert a != task.generate(20, seed=4)
    assert task.generate(20, seed=3, split="val") != a
    assert task.generate(10, lengths=[5, 6], seed=1) == task.generate(10, lengths=[5, 6], seed=1)


def test_examples_valid(task):
    vocab = task.vocab()
    assert len(vocab) == len(set(vocab)), "vocab has duplicates"
    words = set(vocab)
    for split in ("train", "val", "test"):
        allowed = task.split_lengths(split)
        for ex in task.generate(N, split=split, seed=7):
            assert isinstance(ex, Example)
            assert ex.length in allowed
            assert ex.prompt.split()[-1] == task.separator
            assert ex.target.strip()
            assert set(ex.prompt.split()) | set(ex.target.split()) <= words
            assert task.is_correct(ex, ex.target)
            assert task.is_correct(ex, "  " + ex.target.replace(" ", "\t ") + "\n")
            assert not task.is_correct(ex, ex.target + " .")
            assert not task.is_correct(ex, _corrupt(ex.target, vocab))
            assert not task.is_correct(ex, "")


def _corrupt(target: str, vocab: list[str]) -> str:
    ws = target.split()
    i = len(ws) // 2  # a word inside the answer (not only the trailing ".")
    ws[i] = next(w for w in vocab if w != ws[i])
    return " ".join(ws)


def test_length_spec_forms():
    t = get_task("summation")
    assert {ex.length for ex in t.generate(30, lengths=4)} == {4}
    assert {ex.length for ex in t.generate(60, lengths=(2, 3))} == {2, 3}
    assert {ex.length for ex in t.generate(60, lengths=[3, 7, 9])} == {3, 7, 9}
    assert {ex.length for ex in t.generate(200, split="test")} == set(range(9, 17))
    with pytest.raises(ValueError):
        t.generate(5, split="dev")


def test_splits_disjoint(task):
    train = {(e.prompt, e.target) for e in task.generate(1500, seed=0)}
    val = {(e.prompt, e.target) for e in task.generate(200, seed=0, split="val")}
    test = {(e.prompt, e.target) for e in task.generate(200, seed=0, split="test")}
    assert not train & val
    assert not train & test
    # A test split forced onto ID lengths still avoids train (hash partition applies).
    lo, hi = task.id_lengths
    forced = task.generate(100, seed=0, split="test", lengths=(lo, hi))
    assert not train & {(e.prompt, e.target) for e in forced}


def test_tiny_length_fallback():
    # Parity of 1 bit has only two prompts: whichever side of the partition is empty must
    # raise instead of leaking examples across splits.
    t = get_task("parity")
    held = [is_held_out(t.sample(1, random.Random(s)).prompt) for s in range(50)]
    for split, wanted in (("train", False), ("val", True)):
        if wanted in held:
            exs = t.generate(5, lengths=1, split=split)
            assert all(is_held_out(e.prompt) == wanted for e in exs)
        else:
            with pytest.raises(ValueError):
                t.generate(5, lengths=1, split=split)
    # Over the full ID range, val still works: exhausted tiny lengths are just skipped.
    val = t.generate(50, split="val")
    assert all(is_held_out(e.prompt) for e in val)


# ----------------------------------------------- independent re-computation of answers


def _answer(target: str) -> str:
    m = re.fullmatch(r"The answer is (.+) \.", target)
    assert m, target
    return m.group(1)


def _number(spaced: str) -> int:
    return int(spaced.replace(" ", ""))


def test_addition_answers():
    t = get_task("addition")
    for ex in t.generate(N) + t.generate(N, split="test"):
        m = re.fullmatch(r"Compute ([\d ]+) \+ ([\d ]+) \?", ex.prompt)
        a, b = m.group(1).split(), m.group(2).split()
        assert max(len(a), len(b)) == ex.length
        assert all(len(x) == 1 or x[0] != "0" for x in (a, b))  # no leading zeros
        assert _number(_answer(ex.target)) == _number(m.group(1)) + _number(m.group(2))
    assert t.is_correct(
        Example("Compute 1 2 + 3 4 ?", "The answer is 4 6 .", 2), "The answer is 4 6 ."
    )


def test_summation_answers():
    for ex in get_task("summation").generate(N, split="test"):
        digits = ex.prompt.removeprefix("Compute : ").removesuffix(" .").split()
        assert len(digits) == ex.length and set(digits) <= set("123456789")
        assert int(_answer(ex.target)) == sum(map(int, digits)) % 10


def test_parity_answers():
    for ex in get_task("parity").generate(N):
        bits = ex.prompt.split("[")[1].split("]")[0].split()
        assert len(bits) == ex.length
        assert _answer(ex.target) == ("Yes" if bits.count("1") % 2 == 0 else "No")


def test_sorting_answers():
    for ex in get_task("sorting").generate(N, split="test"):
        xs = ex.prompt.split("[")[1].split("]")[0].split()
        assert len(xs) == ex.length
        assert ex.target == f"The sorted list is [ {' '.join(sorted(xs, key=int))} ] ."


def test_polynomial_answers():
    for ex in get_task("polynomial").generate(N) + get_task("polynomial").generate(N, split="test"):
        m = re.fullmatch(r"Evaluate at x = (-?\d) in (.+) \?", ex.prompt)
        x, expr = int(m.group(1)), m.group(2)
        terms = expr.split(" + ")
        assert len(terms) == ex.length
        for term in terms:
            c, d = re.fullmatch(r"(-?\d) \* x \*\* (\d)", term).groups()
            assert -3 <= int(c) <= 3 and 0 <= int(d) <= 3
        assert -2 <= x <= 2
        # The expression is valid Python, so evaluate it directly as the reference.
        assert int(_answer(ex.target)) == eval(expr, {"__builtins__": {}}, {"x": x}) % 10


def test_lego_answers():
    for ex in get_task("lego").generate(N) + get_task("lego").generate(N, split="test"):
        body, question = ex.prompt.removeprefix("If ").split(" . Then , what is the value of ")
        clauses = dict(c.split(" = ") for c in body.split(" , "))
        assert len(clauses) == ex.length

        # Walk the chain back to the constant, multiplying signs.
        v, total = question.removesuffix(" ?"), 1
        while v != "1":
            sign, v = clauses[v].split()
            total *= 1 if sign == "+" else -1
        expected = "+ 1" if total > 0 else "- 1"
        assert _answer(ex.target) == expected


def test_copy_reverse_answers():
    for name, f in (("copy", lambda s: s), ("reverse", lambda s: s[::-1])):
        for ex in get_task(name).generate(N, split="test"):
            seq = ex.prompt.split(" : ")[1].removesuffix(" [SEP]").split()
            assert len(seq) == ex.length
            assert ex.target.split() == f(seq)


# ---------------------------------------------------------------------------------- SCAN

L, R = "I_TURN_LEFT", "I_TURN_RIGHT"
J, W, LK, RN = "I_JUMP", "I_WALK", "I_LOOK", "I_RUN"

SCAN_CASES = {
    "jump": [J],
    "jump left": [L, J],
    "jump around right": [R, J] * 4,
    "turn left twice": [L, L],
    "turn opposite left": [L, L],
    "turn around right": [R] * 4,
    "jump opposite right twice": [R, R, J, R, R, J],
    "jump twice after walk left": [L, W, J, J],
    "walk and jump thrice": [W, J, J, J],
    "run opposite left after look twice": [LK, LK, L, L, RN],
    "look around left thrice and turn right": [L, LK] * 12 + [R],
    "walk opposite right thrice after run around left twice": [L, RN] * 8 + [R, R, W] * 3,
}


@pytest.mark.parametrize("command", sorted(SCAN_CASES))
def test_scan_hand_checked(command):
    assert interpret(command) == SCAN_CASES[command]


def test_scan_command_set():
    cmds = all_commands()
    assert len(cmds) == 20_910
    assert len(set(cmds)) == 20_910
    assert set(SCAN_CASES) <= set(cmds)
    by_len = commands_by_length()
    assert sum(map(len, by_len.values())) == 20_910
    assert min(by_len) == 1 and max(by_len) == 48
    assert set(by_len[1]) == {"walk", "look", "run", "jump", "turn left", "turn right"}
    assert [c for c in cmds if len(interpret(c)) == 48] == list(by_len[48])
    vocab = set(get_task("scan").vocab())
    assert all(set(c.split()) <= vocab for c in cmds)


@pytest.mark.parametrize("bad", ["turn", "jump jump", "walk left left", "jump around", "fly"])
def test_scan_rejects_invalid(bad):
    with pytest.raises(ValueError):
        interpret(bad)


def test_scan_examples():
    t = get_task("scan")
    for ex in t.generate(N, split="test"):
        cmd = ex.prompt.removeprefix("Solve : ").removesuffix(" [SEP]")
        assert cmd in all_commands()
        assert len(ex.target.split()) == ex.length
        assert ex.target.split() == interpret(cmd)
    assert not t.has_length(23)  # no command has 23 actions; generate skips it
    assert 23 not in {ex.length for ex in t.generate(300)}


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_basics():
    tok = task_tokenizer(get_task("copy"))
    specials = ["<pad>", "<bos>", "<sep>", "<eos>", "<unk>"]
    assert tok.convert_tokens_to_ids(specials) == [0, 1, 2, 3, 4]
    assert (tok.pad_token_id, tok.bos_token_id, tok.sep_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert tok.unk_token_id == 4 and tok.padding_side == "right"
    ids = tok("Copy : a b [SEP]")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert ids[-1] == tok.sep_token_id
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "Copy", ":", "a", "b", "<sep>"]
    assert tok("zzz", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert len(tok) == 5 + len(get_task("copy").vocab()) - 1  # "[SEP]" folds into <sep>
    with pytest.raises(ValueError):
        build_tokenizer(["two words"])


def test_tokenizer_json_round_trip():
    for name in TASKS:
        task = get_task(name)
        tok = task_tokenizer(task)
        s = tokenizer_to_json(tok)
        assert isinstance(s, str)
        json.loads(s)
        tok2 = tokenizer_from_json(s)
        assert tok2.get_vocab() == tok.get_vocab()
        assert tok2.padding_side == "right"
        assert tok2.all_special_tokens == tok.all_special_tokens
        for ex in task.generate(5, split="test"):
            text = f"{ex.prompt} {ex.target}"
            assert tok2(text)["input_ids"] == tok(text)["input_ids"]
        assert tokenizer_to_json(tok2) == s
    with pytest.raises(ValueError):
        tokenizer_from_json(json.dumps({"format": "other"}))


def test_transformer_lens_integration():
    from nopeinterp._tl import HookedTransformer, HookedTransformerConfig

    tok = task_tokenizer("copy")
    cfg = HookedTransformerConfig(
        d_model=32,
        n_layers=1,
        n_heads=2,
        d_head=16,
        n_ctx=64,
        d_vocab=len(tok),
        act_fn="relu",
        attn_only=True,
        seed=0,
    )
    with warnings.catch_warnings():  # TL 3.9's deprecation notice for HookedTransformer
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=tok)
    toks = model.to_tokens("Copy : a b [SEP]")
    assert toks.tolist() == [tok("Copy : a b [SEP]")["input_ids"]]
    assert (toks == tok.bos_token_id).sum() == 1 and toks[0, 0] == tok.bos_token_id
    assert model.to_str_tokens("Copy : a b [SEP]") == ["<bos>", "Copy", ":", "a", "b", "<sep>"]
    batch = model.to_tokens(["Copy : a [SEP]", "Copy : a b c [SEP]"])
    assert batch[0, -1] == tok.pad_token_id  # right padding
    kw = dict(max_new_tokens=4, do_sample=False, verbose=False)
    out = model.generate(toks, stop_at_eos=False, **kw)
    assert out.shape == (1, toks.shape[1] + 4) and out[0, : toks.shape[1]].equal(toks[0])
    assert isinstance(decode_answer(tok, out[0, toks.shape[1] :]), str)
    out = model.generate(toks, stop_at_eos=True, **kw)  # may stop early at <eos>
    assert out.shape[1] == toks.shape[1] + 4 or out[0, -1] == tok.eos_token_id
    assert isinstance(model.generate("Copy : a b [SEP]", **kw), str)
    # Encoded batches are valid model inputs.
    enc = encode_examples(tok, get_task("copy").generate(3))
    assert model(enc.tokens).shape == (*enc.tokens.shape, len(tok))


# ------------------------------------------------------------------------------ encoding


def test_encode_examples_target_mask():
    task = get_task("addition")
    tok = task_tokenizer(task)
    exs = task.generate(8, split="test") + task.generate(8)
    b = encode_examples(tok, exs)
    assert isinstance(b, Batch) and len(b) == 16
    assert b.tokens.dtype == torch.long and b.target_mask.dtype == torch.bool
    assert b.lengths.tolist() == [e.length for e in exs]
    for i, ex in enumerate(exs):
        n_real = int(b.attention_mask[i].sum())
        row = b.tokens[i, :n_real].tolist()
        prompt_ids = tok(ex.prompt)["input_ids"]  # includes <bos>
        target_ids = tok(ex.target, add_special_tokens=False)["input_ids"]
        assert row == prompt_ids + target_ids + [tok.eos_token_id]
        assert (b.tokens[i, n_real:] == tok.pad_token_id).all()
        P = int(b.prompt_lengths[i])
        assert P == len(prompt_ids) and row[P - 1] == tok.convert_tokens_to_ids("?")
        # Position j is marked iff token j+1 is a target word or the final <eos>.
        marked = b.target_mask[i].nonzero().flatten().tolist()
        assert marked == list(range(P - 1, n_real - 1))
        assert b.tokens[i, 1:][b.target_mask[i, :-1]].tolist() == target_ids + [tok.eos_token_id]
        assert decode_answer(tok, b.tokens[i, P:]) == ex.target
        assert task.is_correct(ex, decode_answer(tok, b.tokens[i, P:]))
    assert not b.target_mask[:, -1].any()


def test_encode_prompt_only_and_errors():
    task = get_task("scan")
    tok = task_tokenizer(task)
    exs = task.generate(4)
    b = encode_examples(tok, exs, with_target=False)
    assert b.attention_mask.sum(1).tolist() == b.prompt_lengths.tolist()
    assert not b.target_mask.any()
    for i, ex in enumerate(exs):
        assert b.tokens[i, : b.prompt_lengths[i]].tolist() == tok(ex.prompt)["input_ids"]
    with pytest.raises(ValueError, match="vocabulary"):
        encode_examples(tok, [Example("Solve : fly [SEP]", "I_JUMP", 1)])
    # decode_answer stops at <eos> and keeps other specials (so they count as wrong).
    ids = tok("I_JUMP I_WALK", add_special_tokens=False)["input_ids"]
    assert decode_answer(tok, ids + [tok.eos_token_id, ids[0]]) == "I_JUMP I_WALK"
    assert decode_answer(tok, [ids[0], tok.pad_token_id]) == "I_JUMP <pad>"
