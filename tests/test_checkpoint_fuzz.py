"""Fuzzing the loaders: whatever a file holds, the result is a checkpoint or a CheckpointError.

Never another exception, never torch's advice to load with weights_only=False, and never any
code run from the file (a pickled object whose __reduce__ would create a sentinel file).
"""

import json
import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nopeinterp import CheckpointError, load_checkpoint, save_checkpoint
from nopeinterp.checkpoint import Checkpoint, load_training_state
from nopeinterp.tasks import build_tokenizer

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class _Payload:
    """Unpickling this runs open(target, "w"): the sentinel file appears if code ran."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from nopeinterp import build_model

    d = tmp_path_factory.mktemp("fuzz")
    tok = build_tokenizer("a b c d e".split())
    model = build_model("t5", n_layers=1, n_heads=2, d_model=16, d_vocab=12, n_ctx=16)
    pt = save_checkpoint(model, d / "good.pt", tokenizer=tok, task="copy", step=3)
    sf = save_checkpoint(model, d / "good.safetensors", tokenizer=tok, task="copy")
    state = {"config": {"task": "copy"}, "model": model.state_dict(), "step": 3}
    torch.save(state, d / "good.state.pt")
    return _Files(
        {
            "dir": d,
            "pt": pt.read_bytes(),
            "raw": torch.load(pt, weights_only=True),
            "sf": sf.read_bytes(),
            "sidecar": json.loads((d / "good.json").read_text()),
            "state": (d / "good.state.pt").read_bytes(),
        }
    )


class _Files(dict):
    def __repr__(self):  # hypothesis prints the arguments of a failing case: keep it short
        return "files"


def assert_clean(err: CheckpointError, path):
    message = str(err)  # names the file (or its .json sidecar), on one line
    assert str(path.with_suffix("")) in message and "\n" not in message
    assert "weights_only" not in message and "Weights only" not in message


def load_or_error(path):
    """A Checkpoint, or the CheckpointError (any other exception fails the test)."""
    try:
        return load_checkpoint(path)
    except CheckpointError as e:
        assert_clean(e, path)
        return e


# Plain values of every type a weights-only pickle or a JSON sidecar can carry, sizes included.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2, 10**9, 2**62]),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["nope", "t5", "nopeinterp-checkpoint", "{}", "[]"]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
plain = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
) | st.builds(lambda n: torch.zeros(n % 5), st.integers(0, 10))


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes(files, data):
    for name in ("r.pt", "r.safetensors"):
        path = files["dir"] / name
        path.write_bytes(data)
        (files["dir"] / "r.json").write_text(json.dumps(files["sidecar"]))
        assert isinstance(load_or_error(path), CheckpointError)
    path = files["dir"] / "r.state.pt"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as e:
        load_training_state(path)
    assert_clean(e.value, path)


@FUZZ
@given(cut=st.floats(0, 1, exclude_max=True))
def test_random_truncations(files, cut):
    for kind, name in (("pt", "t.pt"), ("sf", "t.safetensors"), ("state", "t.state.pt")):
        data = files[kind]
        path = files["dir"] / name
        path.write_bytes(data[: int(len(data) * cut)])
        (files["dir"] / "t.json").write_text(json.dumps(files["sidecar"]))
        if kind == "state":
            with pytest.raises(CheckpointError) as e:
                load_training_state(path)
            assert_clean(e.value, path)
        else:
            assert isinstance(load_or_error(path), CheckpointError)


@FUZZ
@given(sidecar=json_values)
def test_random_json_sidecars(files, sidecar):
    path = files["dir"] / "j.safetensors"
    path.write_bytes(files["sf"])
    (files["dir"] / "j.json").write_text(json.dumps(sidecar))
    assert isinstance(load_or_error(path), CheckpointError)


@FUZZ
@given(
    field=st.sampled_from(["format_version", "pe", "config", "tokenizer", "meta"]),
    value=json_values,
)
def test_random_sidecar_fields(files, field, value):
    path = files["dir"] / "f.safetensors"
    path.write_bytes(files["sf"])
    (files["dir"] / "f.json").write_text(json.dumps({**files["sidecar"], field: value}))
    result = load_or_error(path)
    assert isinstance(result, (Checkpoint, CheckpointError))


def _replace(raw, where, value):
    """A copy of `raw` with one entry (top level, config.<k> or state_dict.<k>) replaced."""
    out = {**raw, "config": dict(raw["config"]), "state_dict": dict(raw["state_dict"])}
    if "." in where:
        outer, key = where.split(".", 1)
        out[outer][key] = value
    else:
        out[where] = value
    return out


FIELDS = [
    "format_version",
    "pe",
    "config",
    "tokenizer",
    "meta",
    "state_dict",
    "config.n_layers",
    "config.n_heads",
    "config.d_model",
    "config.d_vocab",
    "config.n_ctx",
    "config.d_mlp",
    "config.seed",
    "config.act_fn",
    "config.attn_scale",
    "config.num_buckets",
    "config.max_distance",
    "config.shared",
    "config.bogus",
    "state_dict.embed.W_E",
    "state_dict.blocks.0.attn.W_Q",
    "state_dict.rel_pos_bias.0.W_bias",
]


@FUZZ
@given(where=st.sampled_from(FIELDS), value=plain)
def test_random_meta_types(files, where, value):
    path = files["dir"] / "m.pt"
    torch.save(_replace(files["raw"], where, value), path)
    result = load_or_error(path)
    if isinstance(result, Checkpoint):  # a value that happens to be valid loads a working model
        logits = result.model(torch.tensor([[1, 2, 3]]))
        assert logits.shape == (1, 3, result.model.cfg.d_vocab)


@FUZZ
@given(where=st.sampled_from(FIELDS + ["extra", "state_dict.extra"]), inner=plain)
def test_code_in_any_field_never_runs(files, where, inner, tmp_path):
    sentinel = tmp_path / "pwned"
    payload = [inner, _Payload(str(sentinel))]
    path = files["dir"] / "evil.pt"
    torch.save(_replace(files["raw"], where, payload), path)
    sentinel.unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="refused") as e:
        load_checkpoint(path)
    assert_clean(e.value, path)
    with pytest.raises(CheckpointError, match="refused"):
        load_training_state(path)
    assert not sentinel.exists()


def test_malicious_bare_pickle_state_is_refused_not_run(files, tmp_path):
    sentinel = tmp_path / "pwned"
    path = tmp_path / "run.pt.state.pt"
    with open(path, "wb") as f:
        pickle.dump({"step": 3, "x": _Payload(str(sentinel))}, f)
    with pytest.raises(
        CheckpointError, match="refused: the file holds pickled data that is not plain"
    ) as e:
        load_training_state(path)
    assert_clean(e.value, path)
    assert not sentinel.exists()


def test_training_state_roundtrip_and_required_keys(files):
    path = files["dir"] / "good.state.pt"
    state = load_training_state(path, required=("config", "model", "step"))
    assert state["step"] == 3 and state["config"] == {"task": "copy"}
    assert all(isinstance(v, torch.Tensor) for v in state["model"].values())
    with pytest.raises(CheckpointError, match="missing optimizer, scheduler"):
        load_training_state(path, required=("step", "scheduler", "optimizer"))
    torch.save([1, 2], files["dir"] / "list.state.pt")
    with pytest.raises(CheckpointError, match="a list, not a dict"):
        load_training_state(files["dir"] / "list.state.pt")


def test_truncated_message_keeps_the_whole_reason(files):
    path = files["dir"] / "cut.pt"
    path.write_bytes(files["pt"][:100])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    message = str(e.value)
    # torch's reason, whole (the old message cut it at 120 characters mid-word), and no advice
    assert message.endswith("failed reading zip archive: failed finding central directory)")
    assert "miniz" not in message


def test_sidecar_valid_json_not_an_object(files):
    path = files["dir"] / "s.safetensors"
    path.write_bytes(files["sf"])
    for value in ([1, 2], "text", 3, None):
        (files["dir"] / "s.json").write_text(json.dumps(value))
        with pytest.raises(CheckpointError, match=r"s\.json: not a nopeinterp metadata file"):
            load_checkpoint(path)


def test_config_larger_than_its_weights_is_refused_before_building(files):
    # Building these would allocate terabytes; the loader compares sizes with the weights first.
    for key in ("d_model", "d_vocab", "d_mlp", "n_heads", "num_buckets"):
        path = files["dir"] / "big.pt"
        torch.save(_replace(files["raw"], f"config.{key}", 2**40), path)
        with pytest.raises(CheckpointError, match=f"{key}={2**40}"):
            load_checkpoint(path)
    torch.save(_replace(files["raw"], "config.n_layers", 10**6), path)
    with pytest.raises(CheckpointError, match="1 blocks in the file but n_layers=1000000"):
        load_checkpoint(path)


def test_over_long_path(files):
    path = files["dir"] / ("x" * 300 + ".pt")
    with pytest.raises(CheckpointError, match="name too long"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="name too long"):
        load_training_state(path)
