"""The attention explorer: its data (nopeinterp.similarity.explorer) and its HTML (viz.explorer)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from nopeinterp.errors import NopeinterpError
from nopeinterp.similarity.explorer import QUANT, ExplorerData, explorer_data
from nopeinterp.viz.explorer import explorer_html
from nopeinterp.viz.page import Page


@pytest.fixture
def models(tiny):
    return {"t5": tiny("t5", seed=1), "nope": tiny("nope", seed=0), "alibi": tiny("alibi")}


EXAMPLES = [torch.tensor([1, 5, 6, 7, 2, 5]), torch.tensor([1, 9, 3, 3, 3, 3, 2, 4, 8, 11, 1])]


def test_patterns_match_the_models_cached_attention_within_quantisation(models):
    data = explorer_data(models, EXAMPLES, layers=[1, 0])
    assert data.models == ["t5", "nope", "alibi"] and data.layers == [1, 0]
    assert data.left == "nope" and data.reference == "t5"  # NoPE first, whatever the order
    for name, model in models.items():
        for ei, ex in enumerate(EXAMPLES):
            _, cache = model.run_with_cache(ex[None], names_filter=lambda n: "hook_pattern" in n)
            for layer in (0, 1):
                ref = cache[f"blocks.{layer}.attn.hook_pattern"][0].numpy()  # [H, T, T]
                for h in range(data.n_heads):
                    got = data.pattern(name, layer, h, ei)
                    t = len(ex)
                    lower = np.tril(np.ones((t, t), dtype=bool))
                    assert np.isnan(got[~lower]).all()  # causal: nothing above the diagonal
                    assert np.abs(got[lower] - ref[h][lower]).max() <= 0.5 / QUANT + 1e-6
                    # rows still sum to 1 up to the rounding of their t+1 entries
                    sums = np.nansum(got, axis=1)
                    assert np.all(np.abs(sums - 1) <= (np.arange(t) + 1) * 0.5 / QUANT + 1e-6)


def test_json_is_compact_and_round_trips(models):
    data = explorer_data(models, EXAMPLES)
    text = data.to_json()
    again = ExplorerData.from_json(text)
    assert again == data
    # one byte per stored weight (the causal triangle only), base64: 4 chars per 3 bytes
    n_patterns = 3 * 2 * 4  # models x layers x heads (TINY: 2 layers, 4 heads)
    expected = n_patterns * sum(4 * -(-(len(e) * (len(e) + 1) // 2) // 3) for e in EXAMPLES)
    payload = sum(len(s) for m in data.patterns.values() for ly in m for h in ly for s in h)
    assert payload == expected
    assert len(text) < payload + 3 * n_patterns * len(EXAMPLES) + 1000  # quotes, commas, labels
    with pytest.raises(NopeinterpError, match="not explorer data"):
        ExplorerData.from_json(json.dumps({"models": []}))


def test_labels_come_from_a_tokenizer_or_lists(models):
    class Tok:
        def convert_ids_to_tokens(self, ids):
            return [f"w{i}" for i in ids]

    data = explorer_data(models, EXAMPLES, labels=Tok())
    assert data.tokens[0] == ["w1", "w5", "w6", "w7", "w2", "w5"]
    lists = [[f"t{i}" for i in range(len(e))] for e in EXAMPLES]
    assert explorer_data(models, EXAMPLES, labels=lists).tokens == lists
    assert explorer_data(models, EXAMPLES).tokens[1][:3] == ["1", "9", "3"]
    with pytest.raises(NopeinterpError, match="one label per token"):
        explorer_data(models, EXAMPLES, labels=[["a"], ["b"]])


def test_bad_input_is_one_clear_error(models, tiny):
    with pytest.raises(NopeinterpError, match="at least two models"):
        explorer_data({"nope": models["nope"]}, EXAMPLES)
    with pytest.raises(NopeinterpError, match="share n_heads"):
        explorer_data({"nope": models["nope"], "x": tiny("t5", n_heads=2)}, EXAMPLES)
    with pytest.raises(NopeinterpError, match="layers must be in"):
        explorer_data(models, EXAMPLES, layers=[2])
    with pytest.raises(NopeinterpError, match="vocabulary"):
        explorer_data(models, [torch.tensor([1, 99])])
    long = [torch.ones(17, dtype=torch.long)]  # past TINY's n_ctx=16
    assert explorer_data(models, long).tokens[0] == ["1"] * 17  # no limit for these PEs
    with pytest.raises(NopeinterpError, match="'ape' cannot read example 0: learned APE"):
        explorer_data({"nope": models["nope"], "ape": tiny("ape")}, long)
    with pytest.raises(NopeinterpError, match="1-D"):
        explorer_data(models, [torch.ones(2, 3, dtype=torch.long)])
    with pytest.raises(NopeinterpError, match="reference model 'rope'"):
        explorer_data(models, EXAMPLES, reference="rope")


def test_html_fragment_survives_hostile_token_labels(models):
    labels = [["</script><b>x"] * len(e) for e in EXAMPLES]
    data = explorer_data(models, EXAMPLES, labels=labels)
    frag = explorer_html(data, element_id="ex-1")
    assert frag.count("</script>") == frag.count("<script") == 2
    blob = re.search(r"id='ex-1-data'>(.*?)</script>", frag, re.S).group(1)
    assert ExplorerData.from_json(blob) == data
    assert "<option value='nope' selected>" in frag  # left select starts on NoPE
    assert "<option value='mean'>mean</option>" in frag
    with pytest.raises(NopeinterpError, match="element_id"):
        explorer_html(data, element_id="a b")
    page = Page("p").section("attention").add(data).section("again").add(data).page.html()
    assert "id='explorer-1'" in page and "id='explorer-2'" in page
