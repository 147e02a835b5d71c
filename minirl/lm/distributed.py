"""Training on several processes: DistributedDataParallel (DDP) under ``torchrun``, and the device each one uses.

``torchrun --nproc_per_node W -m minirl.cli lm grpo ...`` starts W copies of the same program and tells each, in
environment variables, its ``RANK`` (0 .. W-1), its ``LOCAL_RANK`` on its machine, and the ``WORLD_SIZE`` W. Every
copy loads the same model and trains on its 1/W share of the batch; DDP averages the gradients over the copies during
``backward``, so each optimizer step sees the gradient of the whole batch and the copies keep identical weights.
What needs the whole batch (GRPO's group statistics, whitened advantages, the logged metrics) is summed or gathered
over the copies here. Only rank 0 writes checkpoints, logs and progress bars.

Without ``torchrun`` (``WORLD_SIZE`` unset or 1) every function below is a no-op that returns its input: a plain
``python`` run computes exactly what it computed before this module existed.

Shapes
    B   rows of this process, W processes (the world), W * B rows in all
"""

import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from minirl.lm.model import resolve_device


def init(device: str | torch.device = "auto") -> int:
    """Join the process group ``torchrun`` describes, once; return the world size W (1 outside ``torchrun``).

    ``device`` is where the processes train. CPU tensors travel by gloo; when training on GPUs each process takes its
    own and CUDA tensors travel by nccl as well, so that both CPU tensors (rewards computed from text) and CUDA
    tensors (gradients) can be summed over processes.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if resolve_device(device).type == "cuda":
            torch.cuda.set_device(local_rank())  # one GPU per process: "cuda" now means this process's own
            dist.init_process_group("cpu:gloo,cuda:nccl")
        else:
            dist.init_process_group("gloo")
    return world_size()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def local_rank() -> int:
    """The process's number on its own machine (``LOCAL_RANK``), which picks its GPU."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """True on rank 0, the one process that writes checkpoints, logs and progress bars."""
    return rank() == 0


def device(name: str | torch.device = "auto") -> torch.device:
    """``resolve_device(name)``, made this process's own GPU under ``torchrun`` (``cuda:LOCAL_RANK``)."""
    dev = resolve_device(name)
    if world_size() == 1 or dev.type != "cuda":
        return dev
    if dev.index is not None and dev.index != local_rank():
        raise ValueError(
            f"device {str(name)!r} puts process {rank()} on GPU {dev.index}, but under torchrun each process trains "
            f"on its own GPU (cuda:LOCAL_RANK, here cuda:{local_rank()}); pass device='auto' or 'cuda'"
        )
    return torch.device("cuda", local_rank())


def autocast(dev: torch.device):
    """bf16 autocast on a GPU (matrix products in bfloat16, about twice as fast, half the activation memory); nothing
    on the CPU, where bf16 is slow. The trainers wrap their training forward passes in it."""
    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def shard(n: int, what: str) -> slice:
    """This process's rows of a batch of ``n``: the ``rank``-th of W equal, consecutive slices.

    Equal shares keep the code simple (every process gathers as many rows as it sends); the trainers still divide
    their losses by the whole batch's token count, so a longer share weighs what its tokens weigh.
    """
    w = world_size()
    if n % w:
        raise ValueError(
            f"{what} ({n}) must be a multiple of the number of processes ({w}): each process takes an equal share "
            f"of the batch. Use {what} = {(n // w + 1) * w}, or a number of processes that divides {n}"
        )
    per = n // w
    return slice(rank() * per, (rank() + 1) * per)


def wrap(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in DDP, whose ``backward`` averages the gradients over processes; ``model`` itself with W = 1.

    Call the training forward through the wrapper and everything else (sampling, evaluation, saving) on ``model``:
    both hold the same parameters.
    """
    if world_size() == 1:
        return model
    dev = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None)


def no_sync(model: torch.nn.Module, skip: bool):
    """A context in which ``backward`` only accumulates gradients, without DDP's averaging over processes, when
    ``skip``; a no-op otherwise and with W = 1. For a batch trained in pieces: every piece but the last skips, and the
    last averages what all of them accumulated."""
    if skip and isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over processes (a new tensor; ``x`` itself with W = 1)."""
    if world_size() == 1:
        return x
    total = x.detach().clone()
    dist.all_reduce(total)
    return total


def mean(x: torch.Tensor) -> torch.Tensor:
    """``x`` averaged over processes."""
    return all_sum(x) / world_size() if world_size() > 1 else x


def gather(x: torch.Tensor) -> torch.Tensor:
    """(B, ...) from each process -> (W * B, ...): every process's rows, in rank order (the order of ``shard``)."""
    if world_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.detach().contiguous())
    return torch.cat(parts)


def moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased variance of the entries of ``x`` on every process together, in two passes (the mean first,
    then the squared deviations from it) as ``torch.var`` computes them. With one entry in all: variance NaN."""
    if world_size() == 1:
        return x.mean(), x.var()
    n = all_sum(torch.tensor(float(x.numel()), device=x.device))
    mu = all_sum(x.sum()) / n
    return mu, all_sum(((x - mu) ** 2).sum()) / (n - 1)


@contextlib.contextmanager
def main_first():
    """Run the block on rank 0 first and on the other processes after it: for claiming an output folder and reading
    its checkpoint, which rank 0 may repair (``_io.recover_folder``) before the others read it."""
    if not is_main():
        dist.barrier()
    yield
    if is_main() and world_size() > 1:
        dist.barrier()
