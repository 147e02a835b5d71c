"""Supervised fine-tuning with the prompt masked out of the loss (``notebooks/08_tiny_lm.ipynb``).

The loss is the mean negative log-likelihood of the completion tokens (the eos included) given the prompt:

    L(theta) = - sum_{i, t} log pi_theta(o_{i,t} | q_i, o_{i,<t}) / (number of completion tokens)

The prompt's tokens condition the model but are never targets. The same loop serves R1's cold start, pretraining
the course's model from scratch (``minirl.lm.pretraining``), rejection-sampling SFT and distillation.

Under ``torchrun`` (``minirl.lm.distributed``) each of W processes takes B / W rows of every batch. DDP averages the
W gradients, and an average of per-process means is not the mean over the batch when the processes hold different
numbers of completion tokens; so each process divides its summed loss by the whole batch's token count / W, which
makes DDP's average exactly the gradient of the loss above.

Shapes
    B   examples in a batch
    L   tokens of prompt + completion, left-padded
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from minirl import _validate
from minirl.lm import distributed
from minirl.lm.model import check_vocab
from minirl.lm.sampling import logprobs
from minirl.lm.tasks import Problem

SCHEDULES = ("cosine", "constant")


@dataclass
class SFTConfig:
    """Hyperparameters of ``train``."""

    steps: int = 300  # optimizer steps; training stops here, whatever the loss
    batch_size: int = 32  # examples per step, drawn without replacement, reshuffled each epoch
    lr: float = 1e-3  # peak AdamW learning rate; 1e-3 for a model trained from scratch, 1e-4 or less for fine-tuning
    warmup_steps: int = 20  # linear warm-up from 0 to lr
    schedule: str = "cosine"  # after warm-up: "cosine" decays to lr / 10 at the last step, "constant" stays at lr
    weight_decay: float = 0.01  # AdamW's decoupled weight decay
    grad_clip: float = 1.0  # clip the global gradient norm to this
    eval_every: int = 50  # steps between held-out evaluations (and calls of on_eval)
    seed: int = 0  # shuffling order


@dataclass
class SFTResult:
    """``model`` (trained in place), ``tokenizer``, and ``history``: one dict per step with ``step``, ``loss``,
    ``lr``; evaluation steps add ``heldout_loss`` and whatever ``on_eval`` returned."""

    model: object
    tokenizer: object
    history: list[dict] = field(default_factory=list)


CAUSES = (
    "a learning rate too high (lr, or too short a warm-up), grad_clip too large, or a model that already held NaN or "
    "inf weights. Lower lr or raise warmup_steps, and start again from finite weights"
)


def check_config(cfg: SFTConfig) -> SFTConfig:
    """Check every field of ``cfg`` (type and range) before any work; raise naming the field and what it allows."""
    positive = ("steps", "batch_size", "lr", "grad_clip", "eval_every")
    nonneg = ("warmup_steps", "weight_decay", "seed")
    return _validate.check_config(cfg, positive, nonneg, choices={"schedule": SCHEDULES})


def encode(tokenizer, examples: Sequence) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token tensors for ``(prompt, completion)`` pairs (or Problems): each row is bos + prompt + completion + eos.

    Returns ``ids`` (B, L), ``mask`` (B, L) True on real tokens, and ``loss_mask`` (B, L) True on the completion
    and its eos only. Rows are padded on the left, like the sampler's.
    """
    if not examples:
        raise ValueError("examples must not be empty")
    rows, targets = [], []
    for ex in examples:
        prompt, completion = (ex.prompt, ex.completion) if isinstance(ex, Problem) else ex
        p = tokenizer(prompt)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + c)
        targets.append([False] * len(p) + [True] * len(c))
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])  # (B, L)
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])  # (B, L)
    loss_mask = torch.tensor([[False] * (width - len(t)) + t for t in targets])  # (B, L)
    return ids, mask, loss_mask


def sft_loss(
    model, ids: torch.Tensor, mask: torch.Tensor, loss_mask: torch.Tensor, n_tokens: float | None = None
) -> torch.Tensor:
    """Mean negative log-likelihood over the completion tokens (``loss_mask``), the prompt excluded.

    ``n_tokens`` replaces the denominator, the number of tokens in ``loss_mask``: ``train`` passes the count of the
    whole batch over all processes (divided by their number), of which these rows are one share.
    """
    logp = logprobs(model, ids, mask)  # (B, L)
    return -(logp * loss_mask).sum() / (loss_mask.sum() if n_tokens is None else n_tokens)


@torch.no_grad()
def heldout_loss(model, tokenizer, examples: Sequence, batch_size: int = 256) -> float:
    """``sft_loss`` over ``examples``, weighted by completion tokens, without a gradient."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        ids, mask, loss_mask = (t.to(device) for t in encode(tokenizer, examples[i : i + batch_size]))
        n = int(loss_mask.sum())
        total += sft_loss(model, ids, mask, loss_mask).item() * n
        count += n
    return total / count


def lr_at(step: int, cfg) -> float:
    """Linear warm-up over ``warmup_steps``, then ``lr`` ("constant") or a cosine from ``lr`` to ``lr / 10`` at
    ``steps`` ("cosine"). Under "constant", stopping at step S gives the state a longer run has at step S.
    ``cfg`` is any config with these four fields (``SFTConfig``, ``GRPOConfig``); ``step`` counts from 0."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model,
    tokenizer,
    examples: Sequence,
    cfg: SFTConfig | None = None,
    heldout: Sequence | None = None,
    on_eval: Callable[[object], dict] | None = None,
    progress: bool = False,
) -> SFTResult:
    """Fine-tune ``model`` in place on ``(prompt, completion)`` pairs or Problems, for exactly ``cfg.steps`` steps.

    Every ``cfg.eval_every`` steps and at the end: the loss on ``heldout`` examples, and the metrics ``on_eval(model)``
    returns (held-out accuracy, say), both logged in the history and shown on the progress bar.

    Under ``torchrun``, call ``minirl.lm.distributed.init()`` before putting ``model`` on a GPU (it picks each
    process's own); ``cfg.batch_size`` is the global batch, split evenly over the processes, and the history is the
    same on every process.
    """
    cfg = check_config(cfg or SFTConfig())
    check_vocab(model, tokenizer)
    device = next(model.parameters()).device
    world = distributed.init(device)
    mine = distributed.shard(cfg.batch_size, "batch_size")  # this process's rows of every batch
    ids, mask, loss_mask = encode(tokenizer, examples)  # (N, L) each, N examples
    lengths, targets = mask.sum(1), loss_mask.sum(1)  # (N,) each, kept on the CPU: no device sync per step
    if world > 1 and device != distributed.device(device.type):
        raise ValueError(
            f"the model is on {device}, but under torchrun this process trains on {distributed.device(device.type)}: "
            "call minirl.lm.distributed.init() before moving the model to a GPU, or move it to distributed.device()"
        )
    ids, mask, loss_mask = ids.to(device), mask.to(device), loss_mask.to(device)
    ddp_model = distributed.wrap(model)  # the training forward goes through DDP, which averages the gradients
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    order = torch.empty(0, dtype=torch.long)
    history, shown = [], {}
    model.train()
    bar = tqdm(range(cfg.steps), desc="sft", disable=not progress or not distributed.is_main())
    for step in bar:
        # --- batch: the next examples of a shuffled epoch ---
        if len(order) < cfg.batch_size:
            order = torch.cat([order, torch.randperm(len(ids), generator=shuffle)])
        idx, order = order[: cfg.batch_size], order[cfg.batch_size :]  # the same on every process: one shuffle
        n_tokens = int(targets[idx].sum()) / world  # the global batch's completion tokens, per process
        idx = idx[mine]  # this process's share of the batch
        width = int(lengths[idx].max())  # drop the columns that are padding in every row of this batch
        at = idx.to(device)  # the same rows, as an index on the model's device
        b_ids, b_mask, b_loss_mask = ids[at, -width:], mask[at, -width:], loss_mask[at, -width:]  # (B, L)

        # --- update ---
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        with distributed.autocast(device):
            loss = sft_loss(ddp_model, b_ids, b_mask, b_loss_mask, n_tokens)  # DDP's average of these: the batch mean
        _validate.check_finite(step + 1, CAUSES, loss=loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)  # the norm before clipping
        _validate.check_finite(step + 1, CAUSES, gradient_norm=grad_norm)
        optimizer.step()
        _validate.check_finite_parameters(model, step + 1, CAUSES)

        # --- log ---
        row = {"step": step + 1, "loss": distributed.mean(loss.detach()).item(), "lr": optimizer.param_groups[0]["lr"]}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            model.eval()
            if heldout:
                row["heldout_loss"] = heldout_loss(model, tokenizer, heldout)
            if on_eval is not None:
                row.update(on_eval(model))
            model.train()
        history.append(row)
        shown.update({k: round(v, 3) for k, v in row.items() if k not in ("step", "lr")})
        bar.set_postfix(shown, refresh=False)
    model.eval()
    return SFTResult(model, tokenizer, history)
