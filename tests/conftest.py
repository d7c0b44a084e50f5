import pytest
import torch

from nopeinterp import build_model

TINY = dict(n_layers=2, n_heads=4, d_model=32, d_vocab=24, n_ctx=16)


@pytest.fixture(autouse=True)
def _torch_threads():
    # Small models: thread start-up costs more than it saves on a 2-core CI machine.
    torch.set_num_threads(1)
    yield


@pytest.fixture
def tiny():
    """build a tiny model: tiny(pe, **overrides)"""

    def make(pe, **overrides):
        return build_model(pe, **{**TINY, **overrides})

    return make
