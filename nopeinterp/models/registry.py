"""Name -> implementation tables of the model zoo (one entry per PE module)."""

from nopeinterp.models.alibi import ALiBi, ALiBiTransformer
from nopeinterp.models.ape import LearnedAPETransformer, SinusoidalTransformer
from nopeinterp.models.fire import FIRE, FIRETransformer
from nopeinterp.models.kerple import Kerple, KerpleTransformer
from nopeinterp.models.nope import NoPE, NoPETransformer
from nopeinterp.models.rotary import Rotary, RotaryTransformer
from nopeinterp.models.t5 import T5, T5Transformer
from nopeinterp.models.t5_arch import make_t5_layout

# PEs acting inside attention, which a model may mix per layer.
LAYER_PES = {spec.name: spec for spec in (NoPE(), T5(), ALiBi(), Rotary(), FIRE(), Kerple())}

MODEL_CLASSES = {
    cls.pe: cls
    for cls in (
        NoPETransformer,
        T5Transformer,
        ALiBiTransformer,
        RotaryTransformer,
        LearnedAPETransformer,
        SinusoidalTransformer,
        FIRETransformer,
        KerpleTransformer,
    )
}

# Block layouts other than the default one (`build_model(arch=...)`).
ARCH_LAYOUTS = {"t5": make_t5_layout}
