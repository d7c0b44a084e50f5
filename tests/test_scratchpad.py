"""Scratchpads: every generated scratchpad is re-derived here from its prompt alone (carries,
partial sums, parities, sorted prefixes, term values, variable values), for several formats
per task; scoring is checked on hand-built right and wrong scratchpads."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from nopeinterp.cli import main
from nopeinterp.evaluation import scratchpad_columns
from nopeinterp.tasks import TaskError, get_task, task_tokenizer
from nopeinterp.tasks.base import answer_sentence, spaced_digits
from nopeinterp.tasks.scratchpad import (
    COMPONENT_NAMES,
    components_of,
    final_answer,
    label_words,
    parse_format,
    score_steps,
)

# The official processor's output for 57 + 68 (paper-notes, spacing as the processor writes it)
OFFICIAL_57_68 = (
    "Thinking step by step:  in 7, 8 comp 7 + 8 + carry = 15 + 0 = 15 out 5 [ carry: 1 ] re 5 + 6"
    "  # in 5, 6 comp 5 + 6 + carry = 11 + 1 = 12 out 2 [ carry: 1 ] re  +   # in 0, 0 comp 0 + "
    "0 + carry = 0 + 1 = 1 out 1 [ carry: 0 ] re  +   . Thus,  The answer is 1 2 5."
)


def _nospace(text: str) -> str:
    return "".join(text.split())


def _num(words: str) -> int:
    """'- 2 4' -> -24, '1 5' -> 15 (spaced digits)."""
    return int(words.replace(" ", ""))


def test_addition_full_format_is_the_official_example_up_to_spacing():
    task = get_task("addition", scratchpad="icovr")
    target = task.target(answer_sentence(spaced_digits(125)), lambda: task.steps(57, 68))
    assert _nospace(target) == _nospace(OFFICIAL_57_68)


# --- independent derivations, one per task: component name -> expected text per step --------


def derive_addition(prompt):
    a, b = (
        int(x.replace(" ", "")) for x in re.fullmatch(r"Compute (.*) \+ (.*) \?", prompt).groups()
    )
    n = max(len(str(a)), len(str(b)))
    steps = []
    for k in range(n):
        x, y = a // 10**k % 10, b // 10**k % 10
        cin = int(a % 10**k + b % 10**k >= 10**k)
        cout = int(a % 10 ** (k + 1) + b % 10 ** (k + 1) >= 10 ** (k + 1))
        ra = spaced_digits(a // 10 ** (k + 1)) if k + 1 < n else ""
        rb = spaced_digits(b // 10 ** (k + 1)) if k + 1 < n else ""
        steps.append(
            {
                "input": f"{x} , {y}",
                "computation": f"{x} + {y} + carry = {spaced_digits(x + y)} + {cin} = "
                f"{spaced_digits(x + y + cin)}",
                "output": str((a + b) // 10**k % 10),
                "variables": f"carry : {cout}",
                "remaining": " ".join(f"{ra} + {rb}".split()),
            }
        )
    if a + b >= 10**n:
        steps.append(
            {
                "input": "0 , 0",
                "computation": "0 + 0 + carry = 0 + 1 = 1",
                "output": "1",
                "variables": "carry : 0",
                "remaining": "+",
            }
        )
    return steps, spaced_digits(a + b)


def derive_summation(prompt):
    ds = [int(d) for d in re.fullmatch(r"Compute : (.*) \.", prompt).group(1).split()]
    steps = []
    for k, d in enumerate(ds):
        before = sum(ds[:k]) % 10
        steps.append(
            {
                "input": str(d),
                "computation": f"{d} + sum = {d} + {before} =",
                "output": spaced_digits(d + before),
                "variables": f"sum : {spaced_digits(d + before)} = {sum(ds[: k + 1]) % 10}",
                "remaining": " ".join(map(str, ds[k + 1 :])),
            }
        )
    return steps, str(sum(ds) % 10)


def derive_parity(prompt):
    bits = [int(b) for b in re.search(r"\[ (.*) \]", prompt).group(1).split()]
    steps = []
    for k, b in enumerate(bits):
        steps.append(
            {
                "input": str(b),
                "computation": f"{b} ** par = {b} ** {sum(bits[:k]) % 2}",
                "output": str(sum(bits[: k + 1]) % 2),
                "variables": f"par : {sum(bits[: k + 1]) % 2}",
                "remaining": " ".join(["[", *map(str, bits[k + 1 :]), "]"]),
            }
        )
    return steps, "Yes" if sum(bits) % 2 == 0 else "No"


def derive_polynomial(prompt):
    x = int(re.search(r"x = (\S+) in", prompt).group(1))
    terms = [tuple(map(int, t)) for t in re.findall(r"(\S+) \* x \*\* (\S+)", prompt)]
    values = [c * x**d for c, d in terms]
    steps = []
    for k, ((c, d), v) in enumerate(zip(terms, values, strict=True)):
        before = sum(values[:k]) % 10
        steps.append(
            {
                "input": f"{c} * x ** {d}",
                "computation": f"{c} * {x} ** {d} = {c} * {spaced_digits(x**d)}",
                "output": spaced_digits(v),
                "variables": f"sum : {before} + {spaced_digits(v)} = {sum(values[: k + 1]) % 10}",
                "remaining": " + ".join(f"{c2} * x ** {d2}" for c2, d2 in terms[k + 1 :]),
            }
        )
    return steps, str(sum(values) % 10)


def check_sorting(prompt, parsed, fmt):
    """Selection sort's invariants: step k writes the k-th smallest (the sorted prefix grows by
    one), the remaining list holds exactly the rest, and each step reads the front of the
    list the previous step left."""
    xs = [int(v) for v in re.search(r"\[ (.*) \]", prompt).group(1).split()]
    assert len(parsed) == len(xs)
    lst = list(xs)  # the list as selection sort leaves it after each swap
    for k, step in enumerate(parsed):
        front = lst[k]
        j = lst.index(min(lst[k:]), k)
        lst[k], lst[j] = lst[j], lst[k]
        if "output" in step:
            assert int(step["output"]) == sorted(xs)[k]
        if "remaining" in step:
            rest = [int(v) for v in step["remaining"].strip("[] ").split()]
            assert sorted(rest) == sorted(xs)[k + 1 :] and rest == lst[k + 1 :]
            if k + 1 < len(parsed) and "input" in parsed[k + 1]:
                assert int(parsed[k + 1]["input"]) == rest[0]
        if "input" in step:
            assert int(step["input"]) == front
        if "computation" in step:
            assert step["computation"] == "The minimum of the unsorted portion"
    return " ".join(["The sorted list is [", *map(str, sorted(xs)), "] ."])


def check_lego(prompt, parsed, fmt):
    """Variable values recomputed from the clauses: each step resolves one variable whose
    source is already known (the first is set to 1), the last is the queried one."""
    body, query = re.fullmatch(r"If (.*) \. Then , what is the value of (\S) \?", prompt).groups()
    clauses = body.split(" , ")
    rules = {c.split()[0]: (c.split()[2], c.split()[3]) for c in clauses}
    values = {"1": 1}
    while len(values) <= len(rules):
        for v, (sign, src) in rules.items():
            if src in values and v not in values:
                values[v] = values[src] * (1 if sign == "+" else -1)
    known = {"1"}
    assert len(parsed) == len(rules)
    for k, step in enumerate(parsed):
        var = step.get("input")
        if var is not None:
            assert rules[var][1] in known
            known.add(var)
            if k == len(parsed) - 1:
                assert var == query
            if "output" in step:
                assert step["output"] == f"{'+' if values[var] > 0 else '-'} 1"
            if "computation" in step:
                sign, src = rules[var]
                want = (
                    ""
                    if src == "1"
                    else f"{sign} {src} = {sign} {'+' if values[src] > 0 else '-'} 1"
                )
                assert step["computation"] == want
            if "remaining" in step:
                left = [c for c in clauses if c.split()[0] not in known]
                assert step["remaining"] == " , ".join(left)
    return f"The answer is {'+' if values[query] > 0 else '-'} 1 ."


DERIVED = {
    "addition": derive_addition,
    "summation": derive_summation,
    "parity": derive_parity,
    "polynomial": derive_polynomial,
}
CHECKED = {"sorting": check_sorting, "lego": check_lego}
FORMATS = {
    "addition": ["icovr", "co", "ov", "icr", "v"],
    "summation": ["icovr", "co", "iv", "r"],
    "parity": ["icovr", "cv", "or"],
    "polynomial": ["icovr", "co", "ivr"],
    "sorting": ["icor", "or", "i"],
    "lego": ["icor", "co", "ir"],
}
CASES = [(t, f) for t, fmts in FORMATS.items() for f in fmts]


@pytest.mark.parametrize(("name", "fmt"), CASES)
def test_each_scratchpad_re_derived_from_its_prompt(name, fmt):
    task = get_task(name, scratchpad=fmt)
    plain = get_task(name)
    rng = random.Random(f"test/{name}/{fmt}")
    names = [COMPONENT_NAMES[c] for c in fmt]
    for length in (1, 2, 5, 8, 12, 16):
        for _ in range(6):
            ex = task.sample(length, rng)
            parsed = components_of(ex.target, task.scratchpad)
            assert all(set(step) == set(names) for step in parsed)
            if name in DERIVED:
                want, answer = DERIVED[name](ex.prompt)
                assert parsed == [{n: s[n] for n in names} for s in want]
                answer = answer_sentence(answer)
            else:
                answer = CHECKED[name](ex.prompt, parsed, fmt)
            assert final_answer(ex.target) == answer
            # the step count is what the answer needs, whatever the format
            assert ex.target.count(" # ") == len(parsed) - 1
            # markers of components left out never appear; the tokenizer covers every word
            absent = {"i": "in", "c": "comp", "o": "out", "r": "re"}
            for letter, marker in absent.items():
                if letter not in fmt and marker not in ex.prompt:
                    assert marker not in ex.target.split()
            assert ex.length == length
            assert task.is_correct(ex, ex.target)
            assert not plain.scratchpad


@pytest.mark.parametrize("name", list(FORMATS))
def test_lengths_and_prompts_unchanged_by_a_scratchpad(name):
    task, plain = get_task(name, scratchpad=FORMATS[name][0]), get_task(name)
    assert (task.id_lengths, task.ood_lengths) == (plain.id_lengths, plain.ood_lengths)
    for split in ("train", "val", "test"):
        a = task.generate(20, split=split, seed=3)
        b = plain.generate(20, split=split, seed=3)
        assert [(e.prompt, e.length) for e in a] == [(e.prompt, e.length) for e in b]
        assert all(final_answer(x.target) == y.target for x, y in zip(a, b, strict=True))
    tok = task_tokenizer(task)
    ids = tok([e.target for e in task.generate(50, split="test")], add_special_tokens=False)
    assert tok.unk_token_id not in {i for row in ids["input_ids"] for i in row}


def test_labels_mark_components_markers_and_answer():
    task = get_task("parity", scratchpad="icovr")
    target = task.target(answer_sentence("No"), lambda: task.steps([1, 0]))
    words = target.split()
    labels = label_words(words, "icovr")
    pairs = list(zip(words, labels, strict=True))
    assert pairs[:5] == [(w, "markers") for w in "Thinking step by step :".split()]
    assert ("in", "markers") in pairs and ("#", "markers") in pairs
    # the remaining list's brackets are content, the variables' brackets are markers
    assert pairs[pairs.index(("re", "markers")) + 1] == ("[", "remaining")
    assert labels[-5:] == ["answer"] * 5
    assert label_words(["The", "answer"], "") == ["answer", "answer"]


# --- scoring on hand-built scratchpads --------------------------------------------------------

RIGHT = (
    "Thinking step by step : in 7 , 8 comp 7 + 8 + carry = 1 5 + 0 = 1 5 out 5 [ carry : 1 ] "
    "re 5 + 6 # in 5 , 6 comp 5 + 6 + carry = 1 1 + 1 = 1 2 out 2 [ carry : 1 ] re + # in 0 , 0 "
    "comp 0 + 0 + carry = 0 + 1 = 1 out 1 [ carry : 0 ] re + . Thus , The answer is 1 2 5 ."
)


def _example():
    task = get_task("addition", scratchpad="icovr")
    from nopeinterp.tasks import Example

    return task, Example("Compute 5 7 + 6 8 ?", RIGHT, 2)


def test_scoring_a_right_scratchpad():
    task, ex = _example()
    assert ex.target == task.target(answer_sentence("1 2 5"), lambda: task.steps(57, 68))
    assert task.is_correct(ex, RIGHT)
    assert task.is_correct(ex, RIGHT.replace(" ", "  "))  # whitespace is not a word
    s = score_steps(RIGHT, RIGHT)
    assert (s.n_steps, s.n_right, s.first_wrong, s.share_right) == (3, 3, None, 1.0)


@pytest.mark.parametrize(
    ("prediction", "answer_ok", "n_right", "first_wrong"),
    [
        # second step forgets the carry, the answer is still right: answer-only says right
        (RIGHT.replace("= 1 1 + 1 = 1 2", "= 1 1 + 0 = 1 1", 1), True, 2, 1),
        # every step right, a wrong final answer
        (RIGHT.replace("is 1 2 5", "is 1 2 4"), False, 3, None),
        # first step wrong (carry), the rest right
        (RIGHT.replace("[ carry : 1 ]", "[ carry : 0 ]", 1), True, 2, 0),
        # stopped after one step, no closing marker, no answer
        (RIGHT.split(" # ")[0], False, 1, 1),
        # an extra step before the answer
        (RIGHT.replace(" . Thus", " # in 0 , 0 . Thus"), True, 3, 3),
        # no scratchpad at all, only the answer
        ("The answer is 1 2 5 .", False, 0, 0),
        # the answer after the closing marker has trailing words
        (RIGHT + " 5", False, 3, None),
    ],
)
def test_scoring_wrong_scratchpads(prediction, answer_ok, n_right, first_wrong):
    task, ex = _example()
    assert task.is_correct(ex, prediction) is answer_ok
    s = score_steps(ex.target, prediction)
    assert (s.n_steps, s.n_right, s.first_wrong) == (3, n_right, first_wrong)


def test_per_length_step_columns():
    task, ex = _example()
    wrong = RIGHT.replace("[ carry : 1 ]", "[ carry : 0 ]", 1)
    cols = scratchpad_columns([ex, ex, ex], [RIGHT, wrong, RIGHT.split(" # ")[0]])
    assert cols["all_steps_right"] == 1
    assert cols["steps_right"] == pytest.approx((1 + 2 / 3 + 1 / 3) / 3)
    assert cols["first_wrong_step"] == pytest.approx((0 + 1) / 2)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [("icx", "unknown scratchpad component 'x'"), ("cc", "repeats"), (3, "letters")],
)
def test_bad_formats(value, message):
    with pytest.raises(TaskError, match=message):
        get_task("addition", scratchpad=value)


def test_formats_canonical_and_task_limits():
    assert parse_format("rvoci") == "icovr"
    assert parse_format("none") == parse_format(None) == ""
    assert get_task("addition", scratchpad="none").scratchpad == ""
    with pytest.raises(TaskError, match="no variables"):
        get_task("sorting", scratchpad="icovr")  # the official processor refuses it too
    with pytest.raises(TaskError, match="has no scratchpad"):
        get_task("copy", scratchpad="co")
    assert get_task("scan", scratchpad="none").scratchpad == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--task", "addition:scratchpad=icx", "--pe", "nope"], "component 'x'"),
        (["train", "--task", "copy:scratchpad=co", "--pe", "nope"], "copy has no scratchpad"),
        (["sweep", "--tasks", "lego:scratchpad=v", "--pes", "nope"], "no variables"),
    ],
)
def test_cli_bad_scratchpad_one_line_exit_2_nothing_written(tmp_path, capsys, argv, message):
    out = tmp_path / ("run.pt" if argv[0] == "train" else "grid")
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert list(tmp_path.iterdir()) == []


def test_counter_of_steps_matches_length():
    # one step per input element (addition: per column, plus a final carry)
    for name, fmt in (("parity", "o"), ("summation", "o"), ("polynomial", "o")):
        task = get_task(name, scratchpad=fmt)
        for ex in task.generate(10, split="test"):
            assert Counter(ex.target.split())["#"] == ex.length - 1


def test_paper_scratchpad_runs_read_the_official_file():
    import csv

    from nopeinterp.paper import PAPER_PES, PAPER_SCRATCHPAD, paper_scratchpad_runs

    runs = paper_scratchpad_runs()
    with open(PAPER_SCRATCHPAD) as f:
        raw = [r for r in csv.DictReader(f) if r["test_acc_overall"]]
    assert len(runs) == len(raw)
    for row, r in zip(runs.itertuples(), raw, strict=True):
        assert row.pe == PAPER_PES[r["pe"]] and row.seed == int(r["seed"])
        assert row.ood_accuracy == float(r["test_acc_overall"])
        flags = [p[-1] == "1" for p in r["scratchpad"].split("_")]
        assert row.scratchpad == "".join(c for c, on in zip("icovr", flags, strict=True) if on)
        assert row.task == r["dataset"].removeprefix("s2s_")


# --- the decode bound: each item's own, whatever it is batched with ---------------------------
def _never_stopping_model(tok, seed=0):
    """A small untrained model that never writes <eos> (its logit pushed down), so every row
    decodes to its bound."""
    import torch

    from nopeinterp import build_model

    model = build_model(
        "nope", n_layers=1, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=1024, tokenizer=tok,
        seed=seed,
    )  # fmt: skip
    with torch.no_grad():
        model.unembed.b_U[tok.eos_token_id] = -1e4
    return model


@pytest.mark.parametrize("scratchpad,factor", [("icovr", 2), ("none", 1)])
def test_each_item_decodes_to_its_own_bound_in_any_batch(scratchpad, factor):
    """An item's answer is the same alone and batched with longer items: each row stops at its
    own target's bound (x2 with a scratchpad: a longer scratchpad can still end in the right
    answer), never at the longest target of its batch."""
    from nopeinterp.evaluation import bound_factor, greedy_answers

    task = get_task("addition", scratchpad=scratchpad)
    assert bound_factor(task) == factor
    tok = task_tokenizer(task)
    model = _never_stopping_model(tok)
    short = task.generate(3, lengths=1, seed=0, split="val")
    long = task.generate(3, lengths=6, seed=0, split="val")
    batched = greedy_answers(model, tok, [*short, *long], task=task)
    alone = [greedy_answers(model, tok, [e], task=task)[0] for e in short]
    assert batched[:3] == alone
    for example, answer in zip([*short, *long], batched, strict=True):
        assert len(answer.split()) == factor * len(example.target.split()) + 1


def test_bounds_that_differ_between_rows_need_an_eos():
    import torch

    from nopeinterp.evaluation import greedy_ids

    tok = task_tokenizer(get_task("addition"))
    model = _never_stopping_model(tok)
    tokens, mask = torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="need an <eos>"):
        greedy_ids(model, tokens, mask, torch.tensor([2, 5]), None)
    assert greedy_ids(model, tokens, mask, torch.tensor([2, 5]), tok.eos_token_id).shape == (2, 5)
    assert greedy_ids(model, tokens, mask, 4, None).shape == (2, 4)


def test_an_answer_only_exact_match_is_the_same_at_any_longer_bound():
    """Why answer-only records need no second test: with a shipped checkpoint (copy, NoPE) the
    per-item bound and one bound of 3x the longest target give the same exact match per item."""
    from pathlib import Path

    from nopeinterp import load_checkpoint
    from nopeinterp.evaluation import greedy_answers, greedy_decode

    ckpt = load_checkpoint(Path(__file__).parents[1] / "checkpoints" / "copy-nope.pt")
    task = get_task("copy")
    examples = [*task.generate(8, lengths=5, seed=0), *task.generate(8, lengths=30, seed=0)]
    per_item = greedy_answers(ckpt.model, ckpt.tokenizer, examples, task=task)
    longest = 3 * max(len(e.target.split()) for e in examples)
    loose = greedy_decode(ckpt.model, ckpt.tokenizer, examples, max_new_tokens=longest)
    right = [task.is_correct(e, a) for e, a in zip(examples, per_item, strict=True)]
    assert right == [task.is_correct(e, a) for e, a in zip(examples, loose, strict=True)]
    assert 0 < sum(right) < len(right)  # some right, some wrong: the comparison can differ
