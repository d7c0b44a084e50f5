"""The analyses on imported models hold one layer's activations at a time, not every layer's.

Measured as the peak bytes of the tensors read from hook points that are alive at once: every
hook point output that some hook reads (a cache's or a stream's) is tracked by its storage
until the storage is freed, and at each such output the bytes alive are compared with what
one layer of the largest batch so far needs, whatever the number of layers (4 here):
  - probe_position reads the residual stream; the forward pass itself holds a block's input
    while its output is read, so two residual tensors of the batch;
  - distance_dependence reads a layer's scores and pattern: both, one layer;
  - attention_sinks reads the pattern: one layer's;
  - compare_attention reads the pattern of both models: one layer's per model (its result
    keeps one example's pattern per model, a batch of one).
Tiny random GPT-2 and Llama models built offline with transformers, imported with from_hf.
"""

import weakref

import pytest
import torch
import transformers as tf

from nopeinterp._tl import TL4
from nopeinterp.data import random_sequences
from nopeinterp.models.hf import from_hf
from nopeinterp.probing import attention_sinks, distance_dependence, probe_position
from nopeinterp.similarity import compare_attention

pytestmark = pytest.mark.skipif(TL4, reason="instruments TL 3.9's HookPoint")

N_LAYERS = 4


def gpt2(seed):
    torch.manual_seed(seed)
    cfg = tf.GPT2Config(vocab_size=40, n_embd=32, n_head=4, n_layer=N_LAYERS, n_positions=64)
    return from_hf(tf.GPT2LMHeadModel(cfg).eval())


def llama(seed):
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=N_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return from_hf(tf.LlamaForCausalLM(cfg).eval())


class HookedBytes:
    """Peak over hook reads of (bytes of read hook outputs alive) / (what one layer of the
    largest batch so far needs)."""

    def __init__(self, per_layer):
        self.per_layer = per_layer  # hook output tensor -> bytes one layer of its batch needs
        self.unit = 0
        self.alive: dict[int, int] = {}
        self.worst = 0.0
        self.worst_at = None

    def read(self, name, x):
        storage = x.untyped_storage()
        key = storage.data_ptr()
        if key not in self.alive:
            self.alive[key] = storage.nbytes()
            weakref.finalize(storage, self.alive.pop, key, None)
        self.unit = max(self.unit, self.per_layer(x))
        ratio = sum(self.alive.values()) / self.unit
        if ratio > self.worst:
            self.worst, self.worst_at = ratio, (name, tuple(x.shape), len(self.alive))


@pytest.fixture
def hooked(monkeypatch):
    from transformer_lens.hook_points import HookPoint

    meters = []
    forward = HookPoint.forward

    def tracked(self, x):
        if self._forward_hooks and isinstance(x, torch.Tensor) and meters:
            meters[-1].read(self.name, x)
        return forward(self, x)

    monkeypatch.setattr(HookPoint, "forward", tracked)

    def start(per_layer):
        meters.append(HookedBytes(per_layer))
        return meters[-1]

    return start


def nbytes(x):
    return x.numel() * x.element_size()


def data(model):
    return random_sequences(model, [((20, 24), 12), ((25, 28), 6)], seed=3)


MODELS = {"gpt2": gpt2, "llama": llama}


@pytest.mark.parametrize("arch", MODELS)
def test_probe_position_holds_one_layer_of_the_residual_stream(arch, hooked):
    model = MODELS[arch](0)
    meter = hooked(lambda x: 2 * nbytes(x))
    probe_position(model, data(model), id_lengths=(20, 24), ood_lengths=(25, 28), n_train=10,
                   n_eval=4, progress=False)  # fmt: skip
    assert meter.worst_at is not None
    assert meter.worst <= 1.0, meter.worst_at


@pytest.mark.parametrize("arch", MODELS)
def test_distance_dependence_holds_one_layer_of_attention(arch, hooked):
    model = MODELS[arch](0)
    meter = hooked(lambda x: 2 * nbytes(x))  # scores and pattern
    distance_dependence(model, data(model), id_lengths=(20, 24), ood_lengths=(25, 28),
                        n_eval=6, progress=False)  # fmt: skip
    assert meter.worst_at is not None
    assert meter.worst <= 1.0, meter.worst_at


@pytest.mark.parametrize("arch", MODELS)
def test_attention_sinks_holds_one_layer_of_attention(arch, hooked):
    model = MODELS[arch](0)
    meter = hooked(nbytes)
    attention_sinks(model, data(model), id_lengths=(20, 24), ood_lengths=(25, 28), n_eval=6,
                    progress=False)  # fmt: skip
    assert meter.worst_at is not None
    assert meter.worst <= 1.0, meter.worst_at


@pytest.mark.parametrize("arch", MODELS)
def test_compare_attention_holds_one_layer_of_attention_per_model(arch, hooked):
    nope, ref = MODELS[arch](0), MODELS[arch](1)
    meter = hooked(lambda x: 2 * nbytes(x))  # both models' patterns
    compare_attention(nope, {"ref": ref}, data(nope), id_lengths=(20, 24),
                      ood_lengths=(25, 28), n_boot=10, progress=False)  # fmt: skip
    assert meter.worst_at is not None
    assert meter.worst <= 1.0, meter.worst_at
