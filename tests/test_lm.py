"""Language modelling: the corpus split, chunks, the BPE tokenizer, training on the `lm` task,
loss by position (held to a plain cross-entropy), sliding vs non-overlapping windows, passkey
prompts and scoring, lm-eval on a tiny from_hf model, and bad corpora / lengths."""

import dataclasses
import hashlib
import json
import re

import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from nopeinterp import build_model, load_checkpoint
from nopeinterp.cli import main
from nopeinterp.lm_eval import (
    LMEvalError,
    lm_eval,
    passkey,
    passkey_correct,
    passkey_keys,
    passkey_prompt,
    position_loss,
    windows,
)
from nopeinterp.tasks import get_task
from nopeinterp.tasks.lm import (
    EOT,
    SPLIT_BUCKETS,
    chunks,
    read_corpus,
    split_of,
    token_stream,
    train_tokenizer,
)
from nopeinterp.training import make_config, train

WORDS = "def return import class self value index result list dict for while if else".split()


def _text(i: int) -> str:
    """A small deterministic Python-like document."""
    lines = [
        f"def f{i}_{k}(x):\n    return x + {i * k} * {WORDS[(i + k) % len(WORDS)]}\n"
        for k in range(12)
    ]
    return "".join(lines)


def _names(per_split: int = 3) -> list[str]:
    """File names until every split holds `per_split` documents (the split is by name)."""
    names, counts, i = [], dict.fromkeys(SPLIT_BUCKETS, 0), 0
    while min(counts.values()) < per_split:
        name = f"pkg/mod{i}.py"
        counts[split_of(name)] += 1
        names.append(name)
        i += 1
    return names


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i, name in enumerate(_names()):
        path = root / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(_text(i))
    (root / "blob.bin").write_bytes(b"\x00\x01binary")
    (root / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "blank.txt").write_text("  \n")
    return root


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NOPEINTERP_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tokenizer(corpus_dir):
    corpus = read_corpus(corpus_dir)
    return train_tokenizer([d.text for d in corpus.documents["train"]], vocab_size=300)


def test_split_is_by_md5_of_the_name_and_skips_bad_files(corpus_dir):
    corpus = read_corpus(corpus_dir)
    assert corpus.skipped == {"binary": 1, "not UTF-8": 1, "empty": 1}
    for split, docs in corpus.documents.items():
        lo, hi = SPLIT_BUCKETS[split]
        for doc in docs:
            bucket = int.from_bytes(hashlib.md5(doc.name.encode()).digest()[:8], "big") % 100
            assert lo <= bucket < hi
    assert sum(map(len, corpus.documents.values())) == len(_names())
    again = read_corpus(corpus_dir)
    assert {s: [d.name for d in v] for s, v in again.documents.items()} == {
        s: [d.name for d in v] for s, v in corpus.documents.items()
    }


def test_adding_a_file_moves_no_other(corpus_dir, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(corpus_dir, copy)
    (copy / "pkg" / "new_module.py").write_text("x = 1\n")
    before = {d.name: s for s, v in read_corpus(corpus_dir).documents.items() for d in v}
    after = {d.name: s for s, v in read_corpus(copy).documents.items() for d in v}
    assert {k: after[k] for k in before} == before


def test_jsonl_corpus(tmp_path):
    path = tmp_path / "docs.jsonl"
    names = _names()
    path.write_text("\n".join(json.dumps({"id": n, "text": _text(i)}) for i, n in enumerate(names)))
    corpus = read_corpus(path)
    assert {d.name for v in corpus.documents.values() for d in v} == set(names)
    assert all(split_of(d.name) == s for s, v in corpus.documents.items() for d in v)


def test_stream_and_chunks(corpus_dir, tokenizer):
    docs = read_corpus(corpus_dir).documents["val"]
    stream = token_stream(tokenizer, docs)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    assert int((stream == eot).sum()) == len(docs)
    assert tokenizer.decode(stream) == "".join(d.text + EOT for d in docs)  # byte-level: lossless
    rows = chunks(stream, 7)
    assert rows.shape == (stream.numel() // 7, 7)
    assert torch.equal(rows.flatten(), stream[: rows.numel()])


def test_tokenizer_is_trained_on_the_training_split_deterministically(corpus_dir, tokenizer):
    task = get_task("lm", corpus=str(corpus_dir), context=16, vocab_size=300)
    assert task.tokenizer().get_vocab() == tokenizer.get_vocab()
    assert len(tokenizer) == 300
    assert tokenizer("import x")["input_ids"][0] != tokenizer.convert_tokens_to_ids(EOT)  # no BOS
    # the batch of a step depends on (seed, step) only; every chunk starts on a chunk boundary
    rows = chunks(task.stream("train"), 16)
    b1, b2 = task.train_batch(4, seed=0, step=3), task.train_batch(4, seed=0, step=3)
    assert torch.equal(b1.tokens, b2.tokens)
    assert all(any(torch.equal(r, c) for c in rows) for r in b1.tokens)
    assert b1.target_mask[:, :-1].all() and not b1.target_mask[:, -1].any()


def _model(tok, pe="nope", **kw):
    return build_model(
        pe, n_layers=2, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=32, tokenizer=tok, **kw
    ).eval()


def test_loss_by_position_is_a_plain_cross_entropy(corpus_dir, tokenizer):
    model = _model(tokenizer, "alibi")
    stream = token_stream(tokenizer, read_corpus(corpus_dir).documents["test"])
    length = 40
    table = position_loss(model, stream, length, max_windows=5)
    rows = stream[: 5 * length].view(5, length)
    with torch.no_grad():
        logp = torch.log_softmax(model(rows).double(), -1)
    nll = -logp[:, :-1].gather(-1, rows[:, 1:, None])[..., 0]  # [5, L-1]
    assert table["position"].tolist() == list(range(1, length))
    assert table["n"].tolist() == [5] * (length - 1)
    torch.testing.assert_close(
        torch.tensor(table["loss"].to_numpy()), nll.mean(0), atol=1e-5, rtol=0
    )


def test_sliding_and_nonoverlapping_windows(corpus_dir, tokenizer):
    assert windows(100, 30) == [(0, 1), (30, 1), (60, 1)]
    assert windows(100, 30, "sliding", 10) == [(0, 1)] + [(s, 20) for s in range(10, 71, 10)]
    with pytest.raises(LMEvalError):
        windows(100, 30, "sliding", 31)
    model = _model(tokenizer, "t5")
    stream = token_stream(tokenizer, read_corpus(corpus_dir).documents["test"])[:200]
    full = position_loss(model, stream, 40)
    same = position_loss(model, stream, 40, mode="sliding", stride=40)
    assert full.equals(same)  # stride = length is the non-overlapping mode
    slide = position_loss(model, stream, 40, mode="sliding", stride=10)
    starts = list(range(0, 200 - 40 + 1, 10))
    # every stream token from the second to the last window's end is scored exactly once
    assert int(slide["n"].sum()) == starts[-1] + 40 - 1
    assert (slide.loc[slide["position"] < 30, "n"] == 1).all()  # the first window only
    assert (slide.loc[slide["position"] >= 30, "n"] == len(starts)).all()
    # a position scored in later windows: the mean of those windows' plain cross-entropies
    rows = torch.stack([stream[s : s + 40] for s in starts])
    with torch.no_grad():
        nll = F.cross_entropy(
            model(rows)[:, :-1].double().transpose(1, 2), rows[:, 1:], reduction="none"
        )
    assert slide.loc[slide["position"] == 35, "loss"].item() == pytest.approx(
        float(nll[:, 34].mean()), abs=1e-5
    )
    assert slide.loc[slide["position"] == 5, "loss"].item() == pytest.approx(
        float(nll[0, 4]), abs=1e-5
    )


def test_passkey_prompts(tokenizer):
    for length, depth in [(300, 0.0), (300, 1.0), (500, 0.5)]:
        ids = passkey_prompt(tokenizer, length, depth, 12345)
        text = tokenizer.decode(ids)
        assert len(ids) <= length
        assert text.startswith("There is an important info") and text.endswith("The pass key is")
        assert "The pass key is 12345. Remember it. 12345 is the pass key." in text
        more = tokenizer(
            text.replace(
                "The grass",
                "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. The grass",
                1,
            )
        )
        assert len(more["input_ids"]) > length  # one more filler sentence would not fit
        before, after = text.split("The pass key is 12345")
        fillers_before, fillers_after = before.count("The grass"), after.count("The grass")
        assert fillers_before + fillers_after > 0
        assert fillers_before == round(depth * (fillers_before + fillers_after))
    assert passkey_correct(" 12345. Remember", 12345)
    assert not passkey_correct(" 1234 5", 12345) and not passkey_correct(" none", 12345)
    assert not passkey_correct(" 123456", 12345)
    keys = passkey_keys(20, 0, 300, 0.5)
    assert len(set(keys)) > 15 and all(10_000 <= k <= 99_999 for k in keys)


def test_passkey_scoring_reads_the_key_of_each_prompt(tokenizer, monkeypatch):
    """A stand-in decoder that answers each (left-padded) prompt's own key scores 1.0; one that
    answers the key of the neighbouring prompt scores 0."""
    import nopeinterp.evaluation as evaluation

    def answer(shift):
        def fake(model, tokens, mask, max_new_tokens, eos, **_):
            keys = [
                re.search(r"pass key is (\d+)", tokenizer.decode(t[m.bool()])).group(1)
                for t, m in zip(tokens, mask, strict=True)
            ]
            keys = keys[shift:] + keys[:shift]
            rows = [tokenizer(f" {k}.", add_special_tokens=False)["input_ids"] for k in keys]
            width = max(map(len, rows))
            return torch.tensor([r + [eos] * (width - len(r)) for r in rows])

        return fake

    monkeypatch.setattr(evaluation, "greedy_ids", answer(0))
    assert passkey(None, tokenizer, 300, 0.5, trials=20)[:2] == (20, 20)
    monkeypatch.setattr(evaluation, "greedy_ids", answer(1))
    assert passkey(None, tokenizer, 300, 0.5, trials=20)[0] == 0


def test_lm_trains_like_any_task_best_by_validation_loss(corpus_dir, tmp_path):
    opts = {"corpus": str(corpus_dir), "context": 16, "vocab_size": 300}
    out = tmp_path / "lm.pt"
    cfg = make_config(
        "lm", "nope", out, preset="tiny", task_options=opts, steps=20, eval_every=5, progress=False
    )
    train(cfg)
    ckpt = load_checkpoint(out)
    history = ckpt.meta["history"]
    assert [h["step"] for h in history] == [5, 10, 15, 20]
    best = min(history, key=lambda h: h["val_loss"])
    assert ckpt.meta["step"] == best["step"] and ckpt.meta["val_loss"] == best["val_loss"]
    assert ckpt.meta["context"] == 16 and set(ckpt.meta["corpus_tokens"]) == {
        "train",
        "val",
        "test",
    }
    assert ckpt.tokenizer.get_vocab() == get_task("lm", **opts).tokenizer().get_vocab()
    # resumed from an interruption: the same weights as the uninterrupted run
    out2 = tmp_path / "lm2.pt"
    for extra in ({"stop_after": 8}, {"resume": True}):
        cfg = make_config("lm", "nope", out2, preset="tiny", task_options=opts, steps=20, **extra)
        train(dataclasses.replace(cfg, eval_every=5, progress=False))
    a, b = load_checkpoint(out).model.state_dict(), load_checkpoint(out2).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lm_trains_on_the_t5_architecture(corpus_dir, tmp_path):
    opts = {"corpus": str(corpus_dir), "context": 16, "vocab_size": 300}
    out = tmp_path / "t5.pt"
    train(make_config("lm", "t5", out, preset="tiny", arch="t5", task_options=opts, steps=3, eval_every=3, progress=False))  # fmt: skip
    ckpt = load_checkpoint(out)
    assert ckpt.meta["config"]["arch"] == "t5" and ckpt.meta["val_loss"] > 0
    assert lm_eval(ckpt, lengths=[240], depths=[0.0], trials=20, max_windows=2, progress=False).perplexity["loss"].gt(0).all()  # fmt: skip


def test_lm_trains_under_torchrun_as_one_process_with_accumulation(corpus_dir, tmp_path, torchrun):
    """Data parallelism on the lm task: rank r's slice of each batch is accumulation step r, so
    two ranks give the weights of one process with grad_accum=2, bit for bit."""
    spec = f"lm:corpus={corpus_dir},context=16,vocab_size=300"
    common = ["--pe", "nope", "--preset", "tiny", "--batch-size", "8", "--steps", "4"]
    out = tmp_path / "ddp.pt"
    proc = torchrun(["--task", spec, *common, "--eval-every", "4", "--out", str(out)])
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, log
    assert load_checkpoint(out).meta["throughput"]["world_size"] == 2
    opts = {"corpus": str(corpus_dir), "context": 16, "vocab_size": 300}
    cfg = make_config(
        "lm", "nope", tmp_path / "accum.pt", preset="tiny", task_options=opts, batch_size=8,
        steps=4, eval_every=4, grad_accum=2, progress=False,
    )  # fmt: skip
    ddp, accum = load_checkpoint(out).model.state_dict(), load_checkpoint(train(cfg)).model.state_dict()  # fmt: skip
    for key in ddp:
        assert torch.equal(ddp[key], accum[key]), key


def test_lm_eval_on_our_checkpoint(corpus_dir, tmp_path):
    opts = {"corpus": str(corpus_dir), "context": 16, "vocab_size": 300}
    out = tmp_path / "lm.pt"
    train(
        make_config("lm", "rotary", out, preset="tiny", task_options=opts, steps=10, progress=False)
    )
    res = lm_eval(
        out, lengths=[240, 300], depths=[0.0, 1.0], trials=20, max_windows=4, progress=False
    )
    assert res.meta["contexts"] == {"lm": 16} and res.meta["corpus"] == str(corpus_dir)
    assert set(res.perplexity["length"]) == {240, 300}
    assert res.passkey["trials"].eq(20).all() and len(res.passkey) == 4
    p = res.perplexity.set_index("length")
    rows = res.table.query("length == 300")  # non-overlapping: every position scored alike
    assert p.loc[300, "loss_past_context"] == pytest.approx(
        float(rows.query("position >= 16")["loss"].mean()), rel=1e-9
    )
    assert p.loc[300, "loss_within_context"] == pytest.approx(
        float(rows.query("position < 16")["loss"].mean()), rel=1e-9
    )
    paths = res.save(tmp_path / "out")
    assert {"lm_loss", "lm_loss_perplexity", "lm_loss_passkey", "meta", "html"} <= set(paths)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("hf")
    cfg = tf.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
        num_hidden_layers=2, intermediate_size=48, max_position_embeddings=1024,
        bos_token_id=None, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    tf.LlamaForCausalLM(cfg).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def test_lm_eval_on_a_tiny_from_hf_model(hf_dir, corpus_dir, tmp_path, capsys):
    import nopeinterp

    model = nopeinterp.from_hf(hf_dir)
    stream = token_stream(model.tokenizer, read_corpus(corpus_dir).documents["test"])
    table = position_loss(model, stream, 64, max_windows=3)
    hf = tf.LlamaForCausalLM.from_pretrained(hf_dir).eval()
    rows = stream[: 3 * 64].view(3, 64)
    with torch.no_grad():
        logits = hf(rows).logits
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), rows[:, 1:], reduction="none").mean(0)
    torch.testing.assert_close(
        torch.tensor(table["loss"].to_numpy(), dtype=torch.float32), nll, atol=1e-4, rtol=0
    )
    out = tmp_path / "ev"
    argv = ["--quiet", "lm-eval", "--hf", str(hf_dir), "--corpus", str(corpus_dir), "--lengths",
            "240,400", "--depths", "0,0.5,1", "--windows", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "perplexity by length" in printed and "passkey accuracy" in printed
    saved = __import__("pandas").read_csv(out / "lm_loss_passkey.csv")
    assert len(saved) == 6 and saved["trials"].eq(20).all()


@pytest.mark.parametrize(
    "case, message",
    [
        ("empty", "no text documents in the corpus (no files)"),
        ("binary", "no text documents in the corpus (1 binary, 1 not UTF-8)"),
        ("missing", "no such corpus file or folder"),
        ("small", "fewer than one context of 100000"),
        ("jsonl", "line 2 is not JSON"),
    ],
)
def test_bad_corpora_one_line_exit_2(case, message, corpus_dir, tmp_path, capsys):
    root = tmp_path / "c"
    root.mkdir()
    corpus, context = str(root), 16
    if case == "binary":
        (root / "a.bin").write_bytes(b"\x00\x00")
        (root / "b.txt").write_bytes(b"\xff\xfe\xfa")
    elif case == "missing":
        corpus = str(tmp_path / "nothing")
    elif case == "small":
        corpus, context = str(corpus_dir), 100_000
    elif case == "jsonl":
        corpus = str(tmp_path / "d.jsonl")
        (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{not json\n')
    out = tmp_path / "run" / "m.pt"
    argv = ["train", "--task", f"lm:corpus={corpus},context={context},vocab_size=300", "--pe",
            "nope", "--preset", "tiny", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_lm_eval_refuses_unreadable_lengths_before_any_work(corpus_dir, tmp_path, capsys):
    opts = {"corpus": str(corpus_dir), "context": 16, "vocab_size": 300}
    ckpt = tmp_path / "ape.pt"
    train(make_config("lm", "ape", ckpt, preset="tiny", task_options=opts, steps=2, progress=False))
    out = tmp_path / "ev"
    assert main(["lm-eval", str(ckpt), "--lengths", "16,64", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot read lengths [64]" in err
    assert not out.exists()
    assert (
        main(["lm-eval", str(ckpt), "--lengths", "16", "--mode", "sliding", "--stride", "17"]) == 2
    )
    assert "stride 17" in capsys.readouterr().err
    huge = ["lm-eval", str(ckpt), "--lengths", "16", "--depths", "0", "--corpus", str(corpus_dir)]
    assert main(huge) == 2  # the passkey prompt alone is longer than 16 tokens
    assert "passkey" in capsys.readouterr().err
    with pytest.raises(LMEvalError, match="fewer than one window"):
        position_loss(load_checkpoint(ckpt).model, torch.arange(10), 16)


def test_study_driver_writes_records_and_the_report_section(
    corpus_dir, tmp_path, monkeypatch, capsys
):
    """analyses/lm_study.py end to end at a tiny size: `run` trains, measures and writes one
    record per run (resumable: a second call skips it); `report` rewrites its REPORT section
    between the markers from the records alone, leaving the rest of the file as it was."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyses"))
    import lm_study as s

    monkeypatch.setattr(s, "PES", ("nope", "alibi"))
    monkeypatch.setattr(s, "SEEDS", (0,))
    monkeypatch.setattr(s, "TASK_OPTIONS", {"corpus": str(corpus_dir), "context": 16, "vocab_size": 300})  # fmt: skip
    monkeypatch.setattr(s, "OVERRIDES", dict(n_layers=1, n_heads=2, d_model=16, steps=4, batch_size=4, eval_every=2, eval_n=4))  # fmt: skip
    monkeypatch.setattr(s, "EVAL", dict(lengths=(240, 300), max_windows=2, depths=(0.0,), trials=20))  # fmt: skip
    monkeypatch.setattr(s, "PROBE", dict(n_fit=20, n_val=5, n_id=5, n_ood=3, ood_length=32))
    monkeypatch.setattr(s, "SINK_WINDOWS", 4)
    for name, value in (("RUNS", tmp_path / "runs"), ("OUT", tmp_path / "out"), ("RECORDS", tmp_path / "out" / "records"), ("REPORT", tmp_path / "REPORT.md")):  # fmt: skip
        monkeypatch.setattr(s, name, value)
    s.REPORT.write_text("# Report\n\nearlier text\n")
    s.report()
    assert "Runs finished: 0 of 2" in s.REPORT.read_text()
    # another `run` holds the first run (its checkpoint's lock): this one leaves it and goes on
    from nopeinterp._io import try_lock
    from nopeinterp.training.sweep import CHECKPOINT, grid, run_name

    nope_ckpt = s.RUNS / run_name(grid([s._spec()], ["nope"], [0])[0]) / CHECKPOINT
    nope_ckpt.parent.mkdir(parents=True)
    held = try_lock(f"{nope_ckpt}.lock")
    s.run(max_runs=None, commit=False)
    assert sorted(p.name for p in s.RECORDS.glob("*.json")) == ["lm-alibi-seed0.json"]
    held.release()
    s.run(max_runs=1, commit=False)  # the finished run is skipped, the released one added
    records = sorted(p.name for p in s.RECORDS.glob("*.json"))
    assert records == ["lm-alibi-seed0.json", "lm-nope-seed0.json"]
    rec = json.loads((s.RECORDS / records[1]).read_text())
    assert rec["val_loss"] > 0 and 0 <= rec["sink_share"] <= 1
    assert {m["model"] for m in rec["probe_mae"]} >= {"trained", "random_init"}
    assert {p["length"] for p in rec["perplexity"]} == {240, 300}
    # a record measured by an older driver is brought up to date from its checkpoint; the
    # numbers it had do not move (the measurements are deterministic)
    path = s.RECORDS / "lm-nope-seed0.json"
    old = json.loads(path.read_text())
    assert old["measures"] == s.MEASURES
    stale = {**old, "perplexity": [{k: v for k, v in r.items() if k != "loss_within_context"} for r in old["perplexity"]]}  # fmt: skip
    del stale["measures"]
    path.write_text(json.dumps(stale))
    s.measure_again([], commit=False)
    new = json.loads(path.read_text())
    assert new["measures"] == s.MEASURES and new["perplexity"] == old["perplexity"]
    assert new["probe_mae"] == old["probe_mae"] and new["sink_heads"] == old["sink_heads"]
    assert "largest change of a number it had: 0\n" in capsys.readouterr().out
    with pytest.raises(s.NopeinterpError, match="no committed record for lm-fire-seed0"):
        s.measure_again(["lm-fire-seed0"], commit=False)
    s.report()
    text = s.REPORT.read_text()
    assert text.startswith("# Report\n\nearlier text\n") and text.count(s.BEGIN) == 1
    assert (
        "Runs finished: 2 of 2." in text and "| alibi |" in text and "| past@300 | rise |" in text
    )
    assert "Rise past the context, smallest first: " in text and "Every NoPE seed rises" in text
    s.report()
    assert s.REPORT.read_text() == text  # regenerated in place, not appended
