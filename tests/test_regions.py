"""Attention mass by region while generating: sums to 1, equals a hand count on full patterns,
works on generated and gold tokens, and on the command line."""

from __future__ import annotations

import pytest
import torch

from nopeinterp import build_model, save_checkpoint
from nopeinterp.cli import main
from nopeinterp.probing.regions import RegionResult, attention_regions
from nopeinterp.tasks import get_task, task_tokenizer
from nopeinterp.tasks.scratchpad import REGIONS, label_words

OPTIONS = {"scratchpad": "co", "id_lengths": [1, 2], "ood_lengths": [3, 3]}


@pytest.fixture(scope="module")
def model():
    task = get_task("addition", **OPTIONS)
    tok = task_tokenizer(task)
    return (
        build_model(
            "nope", n_layers=2, n_heads=2, d_model=32, d_vocab=len(tok), n_ctx=64, tokenizer=tok
        ),
        task,
        tok,
    )


def test_masses_add_up_and_match_a_hand_count(model):
    net, task, tok = model
    res = attention_regions(net, (task, tok), lengths=[2], n=1, tokens="gold", progress=False)
    sums = res.table.groupby(["split", "layer", "head", "query_region"])["mass"].sum()
    assert torch.allclose(
        torch.tensor(sums.values), torch.ones(len(sums), dtype=torch.float64), atol=1e-6
    )
    # by hand: the full pattern of the one sequence, keys summed by their region
    ex = task.generate(1, lengths=2, split="val")[0]
    words = ["<bos>", *ex.prompt.split(), *ex.target.split()]
    labels = ["start"] + ["prompt"] * len(ex.prompt.split()) + label_words(ex.target.split(), "co")
    ids = torch.tensor([tok.convert_tokens_to_ids(words)])
    _, cache = net.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
    first = 1 + len(ex.prompt.split())
    for layer in (0, 1):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # [H, T, T]
        for qr in ("computation", "output", "markers", "answer"):
            queries = [q for q in range(first - 1, len(words) - 1) if labels[q + 1] == qr]
            for kr in REGIONS:
                keys = [k for k, lab in enumerate(labels) if lab == kr]
                want = pattern[:, queries][:, :, keys].sum(-1).mean(-1)  # per head
                got = res.table.query(
                    "layer == @layer and query_region == @qr and key_region == @kr"
                ).sort_values("head")
                assert got["n_queries"].iloc[0] == len(queries)
                assert torch.allclose(torch.tensor(got["mass"].values), want.double(), atol=1e-5)


def test_generated_tokens_and_the_result_shape(model, tmp_path):
    net, task, tok = model
    res = attention_regions(net, (task, tok), n=2, progress=False)
    assert set(res.table["split"]) == {"ID", "OOD"}
    assert set(res.table["key_region"]) == set(REGIONS)
    assert list(res.pivot().columns) == list(REGIONS)
    assert res.meta["tokens"] == "generated" and res.meta["scratchpad"] == "co"
    paths = res.save(tmp_path)
    assert {"attention_regions", "attention_regions_by_layer", "meta", "html"} <= set(paths)
    both = RegionResult.concat([res, res])
    assert len(both.table) == 2 * len(res.table)
    res.figure()
    with pytest.raises(ValueError, match="tokens"):
        attention_regions(net, (task, tok), tokens="model", progress=False)


def test_cli_attention_regions(model, tmp_path, capsys):
    net, task, tok = model
    path = tmp_path / "addition-nope.pt"
    save_checkpoint(net, path, task="addition", task_options=OPTIONS)
    out = tmp_path / "out"
    argv = ["attention-regions", str(path), "--n", "1", "--lengths", "2-3", "--tokens", "gold"]
    assert main([*argv, "--layers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "computation" in printed and "wrote" in printed
    import pandas as pd

    saved = pd.read_csv(out / "attention_regions.csv")
    assert set(saved["layer"]) == {1} and set(saved["split"]) == {"ID", "OOD"}
    assert main(["attention-regions", str(path), "--layers", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "layers" in err
