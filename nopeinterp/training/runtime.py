"""Where and how a training run executes: device, precision, data parallelism, throughput.

Data parallelism is PyTorch's own (torch.distributed + DistributedDataParallel), started by
`torchrun`: it sets RANK / WORLD_SIZE / LOCAL_RANK, and `Runtime.start()` joins the process
group (gloo on CPU, NCCL on CUDA). Nothing here communicates by itself.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from nopeinterp.errors import NopeinterpError, check_choice

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# Dense peak FLOP/s per GPU (vendor data sheets, no sparsity), for MFU. fp32 = plain FP32.
PEAK_FLOPS = {
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "T4": {"fp16": 65e12, "fp32": 8.1e12},
}


def resolve_device(name: str) -> str:
    """'auto' -> cuda, else mps, else cpu; an explicit device must be available."""
    check_choice(name, DEVICES, "device")
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if name == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if (name == "cuda" and not cuda) or (name == "mps" and not mps):
        raise NopeinterpError(f"--device {name}: no {name} device is available on this machine")
    return name


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense peak FLOP/s at `precision`, where we know it (CUDA GPUs above)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAK_FLOPS.items():
        if key in name:
            return peaks.get(precision)
    return None


def flops_per_token(n_params: int, n_layers: int, d_model: int, seq_len: float) -> float:
    """Training FLOPs per token: 6N for the weights plus 12*L*d*T for attention (PaLM, app. B)."""
    return 6 * n_params + 12 * n_layers * d_model * seq_len


@dataclass
class Runtime:
    """One process's view of a run: its device, precision and place in the process group."""

    device: torch.device
    precision: str
    rank: int = 0
    world_size: int = 1
    owns_group: bool = False  # we called init_process_group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def start(cls, device: str, precision: str) -> Runtime:
        """Resolve the device; join the torchrun process group if WORLD_SIZE > 1."""
        check_choice(precision, PRECISIONS, "precision")
        kind = resolve_device(device)
        if kind == "cuda":  # deterministic cuBLAS: set before the first CUDA call
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if kind == "mps" and precision == "bf16" and not _mps_bf16():
            raise NopeinterpError("--precision bf16 is not supported on this mps device")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls(torch.device(kind), precision)
        import torch.distributed as dist

        if kind == "mps":
            raise NopeinterpError("data parallelism (torchrun) runs on cpu or cuda, not mps")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        dev = torch.device("cuda", local) if kind == "cuda" else torch.device("cpu")
        if kind == "cuda":
            torch.cuda.set_device(dev)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
        return cls(dev, precision, dist.get_rank(), dist.get_world_size(), owns)

    def stop(self) -> None:
        if self.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.owns_group = False

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def broadcast(self, value):
        """Rank 0's `value` (a picklable object) on every rank."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def autocast(self):
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def grad_scaler(self):
        """A GradScaler for fp16 (disabled, a no-op, otherwise)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _mps_bf16() -> bool:
    try:
        torch.zeros(1, dtype=torch.bfloat16, device="mps")
        return True
    except (RuntimeError, TypeError):
        return False


@contextlib.contextmanager
def deterministic_algorithms(device: torch.device):
    """torch.use_deterministic_algorithms(True) for the duration, then the caller's setting.

    Why: on CPU with more than one thread, the backward of the token embedding (an
    index-add over repeated token ids) accumulates in a thread-dependent order, so two
    identical runs differ (~1e-8 in W_E's gradient after one step, ~2.5e-4 in the weights
    after 60). Deterministic mode makes it, and every other op, order-stable.
    On CUDA, cuBLAS also needs CUBLAS_WORKSPACE_CONFIG (set here if unset, before first use);
    ops with no deterministic CUDA kernel warn instead of failing.
    """
    before = torch.are_deterministic_algorithms_enabled()
    before_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=before_warn)
