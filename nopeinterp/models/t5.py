"""T5 relative bias: a learned scalar per (distance bucket, head) added to the attention logits.

Causal (unidirectional) buckets as in T5's decoder: half the buckets are exact distances, the
rest log-spaced up to `max_distance`, beyond which all distances share the last bucket. The
bucket function is transformers' own `T5Attention._relative_position_bucket`. One table is
shared by all the layers that use t5 by default (as T5 and the paper do); `shared=False`
gives one per layer.
"""

import torch
from torch import nn
from transformers.models.t5.modeling_t5 import T5Attention

from nopeinterp.models.base import LayerPE, PETransformer, PositionBias, relative_distance


def t5_bucket_ids(distance: torch.Tensor, num_buckets: int = 32, max_distance: int = 128):
    """Bucket id of each `distance = query_pos - key_pos` (>= 0 for visible keys)."""
    # transformers takes memory_position - query_position, i.e. the negated distance.
    return T5Attention._relative_position_bucket(
        -distance, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )


class T5RelativeBias(PositionBias):
    def __init__(self, n_heads: int, num_buckets: int, max_distance: int):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        # "W_" prefix so TL's init_weights initialises it like the other weight matrices.
        self.W_bias = nn.Parameter(torch.zeros(num_buckets, n_heads))
        # bucket id per distance 0..N-1, grown on demand: the log never runs in the hot path.
        self.register_buffer(
            "bucket_of_distance", torch.zeros(0, dtype=torch.long), persistent=False
        )

    def buckets(self, q_len: int, k_len: int) -> torch.Tensor:
        if self.bucket_of_distance.numel() < k_len:
            distances = torch.arange(
                max(k_len, 2 * self.bucket_of_distance.numel()), device=self.W_bias.device
            )
            self.bucket_of_distance = t5_bucket_ids(
                distances, self.num_buckets, self.max_distance
            ).to(self.W_bias.device)
        distance = relative_distance(q_len, k_len, self.W_bias.device).clamp(min=0)
        return self.bucket_of_distance[distance]

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        return self.W_bias[self.buckets(q_len, k_len)].permute(2, 0, 1).unsqueeze(0)


class T5(LayerPE):
    name = "t5"
    bias_attr = "rel_pos_bias"

    def resolve_options(self, cfg, num_buckets=32, max_distance=128, shared=True):
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ValueError(
                f"t5 needs num_buckets >= 2 and max_distance > num_buckets // 2, "
                f"got num_buckets={num_buckets}, max_distance={max_distance}"
            )
        return {"num_buckets": num_buckets, "max_distance": max_distance, "shared": shared}

    def make_bias(self, cfg, options):
        return T5RelativeBias(cfg.n_heads, options["num_buckets"], options["max_distance"])


class T5Transformer(PETransformer):
    pe = layer_pe_default = "t5"
