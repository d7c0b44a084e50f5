"""Outside models through the analyses: random-token and text data for models without a task,
two outside models compared, an outside model against our own model on shared text, the CLI's
--hf / --text / --ref-hf flags. The `tl4` tests (all but the one with our own model) also run
under TransformerLens 4, where `from_hf` gives a TransformerBridge."""

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf

from nopeinterp.data import TOO_SHORT, cut_texts, make_sequences, random_sequences
from nopeinterp.models import build_model
from nopeinterp.models.hf import from_hf
from nopeinterp.probing import distance_dependence, probe_position
from nopeinterp.similarity import compare_attention

VOCAB = 48
BOS = 5


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"<unk>": VOCAB - 1}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tf.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")


def smollm3(seed=0):
    config = tf.SmolLM3Config(
        vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, intermediate_size=48, no_rope_layers=[1, 0, 1, 0],
        max_position_embeddings=256, bos_token_id=BOS, initializer_range=0.25, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    return tf.SmolLM3ForCausalLM(config).eval()


def gpt2(seed=0):
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=64,
                           bos_token_id=BOS)  # fmt: skip
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(config).eval()


def texts(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(f"w{int(i)}" for i in torch.randint(6, 40, (int(k),), generator=g))
            for k in torch.randint(4, 40, (n,), generator=g)]  # fmt: skip


@pytest.mark.tl4
def test_random_sequences_from_the_vocabulary_with_bos_first():
    model = from_hf(smollm3())
    assert model.bos_token_id == BOS
    s = random_sequences(model, [((3, 6), 50), ((9, 9), 4)], seed=1)
    lens = s.attention_mask.sum(1)
    assert ((lens[:50] >= 3) & (lens[:50] <= 6)).all() and (lens[50:] == 9).all()
    assert len(set(lens[:50].tolist())) > 1  # lengths are drawn, not fixed
    assert (s.tokens[:, 0] == BOS).all()
    real = s.tokens[:, 1:][s.attention_mask[:, 1:].bool()]
    assert (real != BOS).all() and real.min() >= 0 and real.max() < VOCAB
    assert len(set(real.tolist())) > VOCAB // 2  # the whole vocabulary, not a corner of it
    again = random_sequences(model, [((3, 6), 50), ((9, 9), 4)], seed=1)
    assert torch.equal(s.tokens, again.tokens)


@pytest.mark.tl4
def test_default_data_for_a_model_without_a_task():
    model = from_hf(smollm3())
    sets = make_sequences(None, model, id_lengths=(4, 8), ood_lengths=(12, 16), n_eval=7)
    assert list(sets) == ["ID", "OOD"]
    assert len(sets["ID"]) == len(sets["OOD"]) == 7
    assert sets["ID"].lengths.max() <= 8 and sets["OOD"].lengths.min() >= 12
    probe = make_sequences(None, model, purpose="probe", id_lengths=(4, 8), ood_lengths=(12, 16),
                           n_train=20, n_eval=10)  # fmt: skip
    assert set(probe) == {"fit", "val", "ID", "OOD"}
    assert sum(len(probe[k]) for k in ("fit", "val", "ID")) == 30
    per = make_sequences(None, model, id_lengths=(4, 5), ood_lengths=(7, 7), n_per_length=2)
    assert sorted(per["ID"].lengths.tolist()) == [4, 4, 5, 5]
    assert per["OOD"].lengths.tolist() == [7, 7]


@pytest.mark.tl4
def test_gpt2_random_data_respects_its_position_table():
    model = from_hf(gpt2())
    sets = make_sequences(None, model, id_lengths=(8, 16), ood_lengths=(60, 70), n_eval=20)
    assert sets["OOD"].lengths.max() <= 64
    assert sets.dropped["OOD"]["longer than the model's position table"] > 0


@pytest.mark.tl4
def test_texts_are_cut_to_the_requested_lengths():
    tok = word_tokenizer()
    docs = ["w7 w8 w9", " ".join(["w9"] * 30)]
    s = cut_texts(docs, tok, [(2, 4), (20, 25)], bos=BOS)
    lens = s.attention_mask.sum(1).tolist()
    # doc 0 (4 tokens with BOS) is cut to 2..4 and is too short for 20..25; doc 1 gives both
    assert len(lens) == 3 and 2 <= lens[0] <= 4 and 2 <= lens[1] <= 4 and 20 <= lens[2] <= 25
    assert s.tokens[0, : lens[0]].tolist() == [BOS, 7, 8, 9][: lens[0]]
    assert (s.tokens[:, 0] == BOS).all()
    assert s.dropped == {TOO_SHORT: 1}
    model = from_hf(smollm3(), tokenizer=tok)
    sets = make_sequences(docs, model, id_lengths=(2, 4), ood_lengths=(20, 25))
    assert len(sets["ID"]) == 2 and len(sets["OOD"]) == 1
    assert sets["OOD"].dropped[TOO_SHORT] == 1
    with pytest.raises(ValueError, match="no document"):
        cut_texts(["w1"], tok, [(5, 6)])


@pytest.mark.tl4
def test_analyses_run_on_an_outside_model():
    model = from_hf(smollm3(), tokenizer=word_tokenizer())
    kw = dict(id_lengths=(6, 12), ood_lengths=(16, 24))
    probe = probe_position(model, n_train=40, n_eval=16, progress=False, **kw)
    assert {"ID", "OOD"} <= set(probe.table["split"])
    dist = distance_dependence(model, n_eval=8, progress=False, **kw)
    assert set(dist.table["layer"]) == {0, 1, 2, 3}
    text = distance_dependence(model, texts(), n_eval=8, progress=False, **kw)
    assert set(text.table["split"]) == {"ID", "OOD"}


@pytest.mark.tl4
def test_compare_two_outside_models_on_shared_text():
    tok = word_tokenizer()
    a, b = from_hf(smollm3(0), tokenizer=tok), from_hf(smollm3(1), tokenizer=tok)
    kw = dict(id_lengths=(4, 10), ood_lengths=(14, 20), n_per_length=1, n_boot=10,
              progress=False)  # fmt: skip
    same = compare_attention(a, {"a": a, "b": b}, **kw)
    mean = same.ranking.groupby("ref")["mean"].max()
    assert mean["a"] == pytest.approx(0.0, abs=1e-6) and mean["b"] > 0.01


def test_compare_an_outside_model_and_one_of_ours_on_shared_text():  # ours: TL 3.9 only
    tok = word_tokenizer()
    a = from_hf(smollm3(0), tokenizer=tok)
    ours = build_model(
        "nope", n_layers=4, n_heads=4, d_model=32, d_vocab=VOCAB, n_ctx=64, tokenizer=tok
    )
    mixed = compare_attention(ours, {"smollm3": a}, texts(40), id_lengths=(4, 10),
                              ood_lengths=(14, 20), n_boot=10, progress=False)  # fmt: skip
    assert set(mixed.ranking["ref"]) == {"smollm3"} and (mixed.ranking["mean"] > 0).all()


@pytest.mark.tl4
def test_cli_hf_flags(tmp_path, cli):
    tok = word_tokenizer()
    for name, seed in (("a", 0), ("b", 1)):
        smollm3(seed).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    (tmp_path / "docs.txt").write_text("\n".join(texts(30)) + "\n")
    lens = ["--id-lengths", "4-10", "--ood-lengths", "14-20"]
    r = cli("probe-position", "--hf", str(tmp_path / "a"), "--n-train", "30", "--n-eval",
            "10", *lens, "--device", "cpu", "--out", str(tmp_path / "pp"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "OOD" in r.stdout and (tmp_path / "pp").is_dir()
    r = cli("probe-distance", "--hf", str(tmp_path / "a"), "--text",
            str(tmp_path / "docs.txt"), "--n-eval", "4", *lens)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = cli("compare-attention", "--nope-hf", str(tmp_path / "a"), "--ref-hf",
            str(tmp_path / "b"), "--n", "1", "--text", str(tmp_path / "docs.txt"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "b" in r.stdout
    r = cli("probe-distance", "--hf", str(tmp_path / "missing"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = cli("probe-distance")
    assert r.returncode == 2 and "--hf" in r.stderr


@pytest.mark.tl4
def test_distance_stats_by_row_blocks_equal_the_whole(monkeypatch):
    import nopeinterp.probing.distance as dist

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 9, 9, generator=g)
    pattern = torch.softmax(scores.masked_fill(~torch.ones(9, 9).tril().bool(), -1e9), -1)
    valid = torch.ones(2, 9, 9, dtype=torch.bool)
    valid[1, 6:] = False
    valid[1, :, 6:] = False
    whole = dist.DistanceStats(3).update(scores, valid, pattern)
    import nopeinterp.probing._stream as stream

    monkeypatch.setattr(stream, "ROW_BLOCK_CELLS", 2 * 3 * 9 * 2)  # 2 query rows per block
    blocks = dist.DistanceStats(3).update(scores, valid, pattern)
    for name in ("count", "gram", "b", "mass", "rel_mass", "rel_uniform", "ss_tot"):
        torch.testing.assert_close(
            getattr(blocks, name), getattr(whole, name), rtol=1e-12, atol=1e-12
        )
    assert (blocks.n_cells, blocks.n_rows) == (whole.n_cells, whole.n_rows)
    torch.testing.assert_close(blocks.solve()[0], whole.solve()[0], rtol=1e-10, atol=1e-12)


@pytest.mark.tl4
def test_attention_divergence_reads_one_layer_at_a_time_and_equals_all_at_once(monkeypatch):
    import nopeinterp.similarity.divergence as div

    a, b = from_hf(smollm3(0)), from_hf(smollm3(1))
    toks = random_sequences(a, [((6, 12), 5)], seed=2)
    layered = div.attention_divergence(a, b, toks, progress=False)
    # the same figures from every layer's patterns cached at once, by hand
    expected = []
    for batch in toks.batches(32):
        mask = batch.attention_mask
        rows_a = div.AttentionRows(a, batch.tokens, mask, range(4))
        rows_b = div.AttentionRows(b, batch.tokens, mask, range(4))
        valid = mask.bool().clone()
        valid[:, 0] = False
        T = batch.tokens.shape[1]
        per_layer = []
        for layer in range(4):
            mat = div.head_pair_divergence(
                rows_a.rows(layer, 0, T)[1], rows_b.rows(layer, 0, T)[1], valid
            )
            per_layer.append(div.reduce_heads(mat.numpy(), "min")[0])
        expected.append(np.stack(per_layer, 1))  # [examples of the batch, layers]
    got = layered.pivot(index="example", columns="layer", values="value").to_numpy()
    np.testing.assert_allclose(got, np.concatenate(expected), rtol=1e-5, atol=1e-7)
    passes = []

    class Counting(div.AttentionRows):
        @classmethod
        def each_layer(cls, model, *args, **kwargs):
            passes.append(model)
            yield from super().each_layer(model, *args, **kwargs)

    monkeypatch.setattr(div, "AttentionRows", Counting)
    again = div.attention_divergence(a, b, toks, progress=False)
    assert len(passes) == 2 * len(list(toks.batches(32)))  # each model once per batch
    assert (again["value"] > 0).all()
    pd.testing.assert_frame_equal(layered, again)
