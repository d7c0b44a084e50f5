"""One options type per analysis (nopeinterp.options): the command line's flags are its fields,
with the same defaults, and values are checked once, on construction."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from nopeinterp import options as O
from nopeinterp.cli import build_parser

# What a subcommand takes besides its options: what to analyse and where to write.
INPUTS = {
    "eval": {"checkpoint", "rope_scaling", "out"},
    "lm-eval": {"checkpoint", "hf", "corpus", "out"},
    "attention-regions": {"checkpoint", "out"},
    "probe-position": {"checkpoint", "hf", "text", "rope_scaling", "out"},
    "probe-distance": {"checkpoint", "hf", "text", "rope_scaling", "out"},
    "erase-position": {"checkpoint", "hf", "text", "rope_scaling", "out"},
    "heads": {"checkpoint", "hf", "text", "rope_scaling", "out"},
    "compare-attention": {
        "ref",
        "ref_hf",
        "nope_hf",
        "text",
        "checkpoints",
        "nope",
        "nope_prime",
        "task",
        "out",
    },  # fmt: skip
    "report": {"checkpoints", "out"},
}
# The subcommands that analyse nothing: every other one is an analysis with an options type.
NOT_ANALYSES = {"info", "train", "sweep", "collect"}
TRAIN_INPUTS = {"task", "pe", "out", "preset", "overwrite"}  # overwrite: not a config
SWEEP_INPUTS = {"tasks", "pes", "seeds", "out", "preset", "workers", "shard", "eval_n_record",
                "test"}  # fmt: skip


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flags(p) -> dict[str, argparse.Action]:
    return {a.dest: a for a in p._actions if not isinstance(a, argparse._HelpAction)}


def test_every_analysis_command_has_an_options_type():
    """A new subcommand that declares its flags by hand, without an options type, fails here."""
    assert set(subparsers()) - NOT_ANALYSES == set(O.ANALYSIS_OPTIONS) == set(INPUTS)


@pytest.mark.parametrize("command", sorted(O.ANALYSIS_OPTIONS))
def test_every_flag_is_an_option_field_with_its_default(command):
    cls = O.ANALYSIS_OPTIONS[command]
    parser = subparsers()[command]
    assert parser.get_default("options") is cls  # the command builds this type from its flags
    found = flags(parser)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(found) - INPUTS[command] == {f.name for f in cls.flags()}
    for dest, action in found.items():
        if dest in INPUTS[command]:
            continue
        assert action.default == cls.default(dest), (command, dest)
        assert fields[dest].metadata.get("flag", True)
    # parsed with no flag, the options are the dataclass's defaults
    args = parser.parse_args([__file__] if "checkpoint" in found else [])  # a path that exists
    built = cls(**{d: getattr(args, d) for d in found if d not in INPUTS[command]})
    assert built == cls()


def test_a_flag_value_reaches_the_option_field():
    parser = subparsers()["probe-position"]
    args = parser.parse_args([__file__, "--n-train", "7", "--layers", "1,0", "--id-lengths",
                              "3-9", "--seed", "4"])  # fmt: skip
    opts = args.options(**{f.name: getattr(args, f.name) for f in args.options.flags()})
    assert (opts.n_train, opts.layers, opts.id_lengths, opts.seed) == (7, (1, 0), (3, 9), 4)
    args = subparsers()["compare-attention"].parse_args(["--n", "3", "--heads", "same"])
    assert (args.n_per_length, args.heads) == (3, "same")


def test_names_mean_one_thing():
    """n_eval, n_train, n_per_length and the lengths are declared once, on the shared bases."""
    declared: dict[str, list[str]] = {}
    every = {c for c in vars(O).values() if isinstance(c, type) and issubclass(c, O._Described)}
    assert set(O.ANALYSIS_OPTIONS.values()) <= every
    for cls in every:
        own = cls.__dict__.get("__annotations__", {})
        for name in own:
            declared.setdefault(name, []).append(cls.__name__)
    for name in ("n_train", "layers", "id_lengths", "ood_lengths", "seed", "device"):
        assert len(declared[name]) == 1, (name, declared[name])
    assert declared["n_train"] == ["FitOptions"]
    assert not hasattr(O.DistanceOptions(), "n_train")  # nothing fitted: no such option


def test_train_and_sweep_flags_are_trainconfig_fields():
    from nopeinterp.training.config import TrainConfig, train_flags

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for command, inputs, grid in (("train", TRAIN_INPUTS, False), ("sweep", SWEEP_INPUTS, True)):
        found = set(flags(subparsers()[command])) - inputs
        expected = set()
        for f in train_flags(grid=grid):
            nested = f.metadata["nested"]
            expected |= {f"{f.name}.{k}" for k in nested} if nested else {f.name}
        assert found == expected, command
        for dest in found:
            assert dest.partition(".")[0] in fields
    assert "seed" not in set(flags(subparsers()["sweep"]))  # a sweep has --seeds


def test_train_flags_map_back_to_the_config():
    from nopeinterp.cli import _train_overrides

    args = subparsers()["train"].parse_args(
        ["--task", "copy", "--pe", "t5", "--out", "x.pt", "--steps", "3", "--num-buckets", "8",
         "--train-lengths", "2-5", "--no-attn-scale", "--seed", "2"]
    )  # fmt: skip
    assert _train_overrides(args) == {
        "steps": 3,
        "seed": 2,
        "attn_scale": False,
        "pe_options": {"num_buckets": 8},
        "task_options": {"id_lengths": [2, 5]},
    }
    args = subparsers()["train"].parse_args(["--task", "copy", "--pe", "t5", "--out", "x.pt"])
    assert _train_overrides(args) == {}  # the preset's values stay


@pytest.mark.parametrize(
    "cls, bad, match",
    [
        (O.ProbeOptions, {"n_train": 0}, "n_train must be >= 1"),
        (O.DistanceOptions, {"n_eval": -1}, "n_eval must be >= 1"),
        (O.CompareOptions, {"heads": "max"}, "heads must be one of"),
        (O.ErasureOptions, {"erase_fraction": 1.0}, "erase_fraction"),
        (O.ErasureOptions, {"concept": "x"}, "concept must be one of"),
        (O.ProbeOptions, {"layers": (-1,)}, "layers are >= 0"),
        (O.ProbeOptions, {"id_lengths": (5, 2)}, "id_lengths must be a range"),
        (O.EvalOptions, {"n": 0}, "n must be >= 1"),
    ],
)
def test_options_are_validated_on_construction(cls, bad, match):
    with pytest.raises(ValueError, match=match):
        cls(**bad)


def test_options_are_frozen_and_reject_unknown_names():
    opts = O.ProbeOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.n_train = 3
    with pytest.raises(TypeError, match="no option n_examples"):
        O.ProbeOptions.make(None, n_examples=3)
    assert O.ProbeOptions.make(opts, n_train=3).n_train == 3


def test_one_layer_check():
    assert O.layer_list(None, 0, 2) == [0, 1, 2]
    assert O.layer_list([2, 0, 2], 0, 2) == [0, 2]
    with pytest.raises(ValueError, match="layer 3 out of range 0..2"):
        O.layer_list([3], 0, 2)


def test_check_choice_returns_the_value_or_names_every_choice():
    from nopeinterp.errors import NopeinterpError, TaskError, check_choice

    assert check_choice("t5", ("nope", "t5"), "pe") == "t5"
    with pytest.raises(NopeinterpError, match=r"^unknown pe 'rope'; choose one of nope, t5$"):
        check_choice("rope", ("nope", "t5"), "pe")
    with pytest.raises(TaskError, match=r"^unknown task 'x' in 'x:a=1'; choose one of copy$"):
        check_choice("x", ("copy",), "task", error=TaskError, where=" in 'x:a=1'")
