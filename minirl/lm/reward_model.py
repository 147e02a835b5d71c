"""A learned reward model: the small LM's trunk with a scalar head (``notebooks/09_rlhf_ppo.ipynb``).

DESIGN.md files the learned reward model under ``rewards``; it lives in a module of its own because it is a trained
network with its own config, training loop and checkpoint, while ``rewards.py`` holds pure rule-based functions.

The model is a causal LM without its output layer (the "trunk": embeddings and transformer blocks) and a linear head
from the hidden size to one number. Reading the hidden state h_t at a position t gives a scalar for the text up to t:

    r(q, o) = w . h_last + b       the score of a whole completion: h at its last real token (the eos)
    V(s_t)  = w . h_t + b          a value per position, when the same class serves as the PPO critic (``rlhf.py``)

The reward model is trained with the Bradley-Terry loss -log sigmoid(r(q, o_chosen) - r(q, o_rejected)) (Ouyang et
al. 2022 Eq. 1, ``minirl.losses.bradley_terry_loss``) and judged by held-out pairwise accuracy: the share of unseen
pairs whose chosen completion it scores higher. Only score differences are learned, so after training the head is
shifted and scaled so that the training completions score mean 0 and standard deviation 1 (InstructGPT normalised
its reward model the same way): the RL stage then sees scores of a known size, and every ranking stays the same.

A checkpoint is a folder: ``model.safetensors`` (trunk and head), ``config.json`` (the trunk's transformers config),
the tokenizer, and ``minirl.json``. No pickle anywhere.

Shapes
    B   pairs (or sequences), L tokens of prompt + completion, H hidden size
"""

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel, AutoTokenizer

from minirl import _validate
from minirl._io import write_folder
from minirl.course import use_threads
from minirl.history import History
from minirl.lm.config import PRETRAINED_RM, RewardModelConfig  # noqa: F401  (re-exported)
from minirl.lm.model import MARKER, check_vocab, load, resolve_device
from minirl.lm.preferences import Pair, check_pairs, make_pairs, split_pairs
from minirl.lm.sampling import positions
from minirl.lm.tasks import TASKS, get_task
from minirl.losses import bradley_terry_loss

KIND = "scalar-lm"  # minirl.json's "kind" for a trunk with a scalar head


class ScalarLM(torch.nn.Module):
    """A causal LM's trunk with a linear head to one number: the reward model, and the PPO critic of ``rlhf.py``."""

    def __init__(self, trunk: torch.nn.Module):
        super().__init__()
        self.trunk = trunk  # a transformers base model (LlamaModel, ...): embeddings and blocks, no output layer
        self.head = torch.nn.Linear(trunk.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)  # every text scores 0 at the start: no preference before the data
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_lm(cls, lm) -> "ScalarLM":
        """A scalar model on the trunk of the causal LM ``lm`` (its ``base_model``), which it shares: copy first."""
        return cls(lm.base_model)

    @property
    def vocab_size(self) -> int:
        return self.trunk.get_input_embeddings().num_embeddings

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A scalar at every position: (B, L) from ids and mask (B, L); position t reads the tokens up to t."""
        mask = mask.bool()
        hidden = self.trunk(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask)).last_hidden_state
        return self.head(hidden).squeeze(-1)  # (B, L)

    def score(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One score per row: the scalar at each row's last real token (the eos of a finished completion). (B,)"""
        last = last_index(mask)  # (B,)
        return self.forward(ids, mask).gather(1, last[:, None]).squeeze(1)  # (B,)


def last_index(mask: torch.Tensor) -> torch.Tensor:
    """The column of each row's last True in ``mask`` (B, L) -> (B,); raises for a row with none."""
    mask = mask.bool()
    if not mask.any(dim=1).all():
        raise ValueError("a row of the mask has no real token; every sequence needs at least one")
    cols = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # (B, L)
    return torch.where(mask, cols, -1).amax(dim=1)  # (B,)


def encode(tokenizer, prompts: list[str], completions: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and mask (B, L) of prompt + completion + eos, the way the sampler lays out a finished completion.

    Prompts are padded on the left and completions on the right; the eos closes each completion, so that the reward
    model scores the same token sequence the policy's samples will hold."""
    enc = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
    comp = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    width = max(len(c) for c in comp)
    comp_ids = torch.full((len(comp), width), tokenizer.pad_token_id, dtype=torch.long)  # (B, C)
    comp_mask = torch.zeros(len(comp), width, dtype=torch.bool)  # (B, C)
    for i, c in enumerate(comp):
        comp_ids[i, : len(c)], comp_mask[i, : len(c)] = torch.tensor(c), True
    ids = torch.cat([enc["input_ids"], comp_ids], dim=1)  # (B, L)
    mask = torch.cat([enc["attention_mask"].bool(), comp_mask], dim=1)  # (B, L)
    return ids.to(device), mask.to(device)


@torch.no_grad()
def scores(model: ScalarLM, tokenizer, prompts: list[str], completions: list[str], batch_size: int = 256):
    """The scores (N,) of completions to their prompts, in batches, without gradients."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    for i in range(0, len(prompts), batch_size):
        ids, mask = encode(tokenizer, prompts[i : i + batch_size], completions[i : i + batch_size], device)
        out.append(model.score(ids, mask).float().cpu())
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0)


def pairwise_accuracy(model: ScalarLM, tokenizer, pairs: list[Pair]) -> float:
    """The share of ``pairs`` whose chosen completion scores higher than the rejected one (a tie counts half)."""
    check_pairs(pairs)
    prompts = [p.prompt for p in pairs]
    chosen = scores(model, tokenizer, prompts, [p.chosen for p in pairs])
    rejected = scores(model, tokenizer, prompts, [p.rejected for p in pairs])
    return ((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean().item()


def normalize_head(model: ScalarLM, tokenizer, prompts: list[str], completions: list[str]) -> tuple[float, float]:
    """Shift and scale the head so that ``completions`` score mean 0, std 1; rankings do not change. Returns the
    (mean, std) before."""
    s = scores(model, tokenizer, prompts, completions)
    mean, std = s.mean().item(), max(s.std().item(), 1e-6)
    with torch.no_grad():
        model.head.weight.div_(std)
        model.head.bias.sub_(mean).div_(std)
    return mean, std


def fit(
    model: ScalarLM,
    tokenizer,
    pairs: list[Pair],
    epochs: int = 2,
    batch_size: int = 32,
    lr: float = 3e-4,
    seed: int = 0,
    max_grad_norm: float = 1.0,
    progress: bool = False,
) -> History:
    """Fit ``model`` to ``pairs`` with the Bradley-Terry loss and AdamW; one history row per minibatch."""
    check_pairs(pairs)
    if model.vocab_size < len(tokenizer):
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the reward model embeds only {model.vocab_size}: they "
            "come from different vocabularies; build the reward model from the policy's own checkpoint"
        )
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(f"fit/{seed}")
    history = History()
    order = list(range(len(pairs)))
    n_batches = epochs * math.ceil(len(pairs) / batch_size)
    bar = tqdm(total=n_batches, desc="reward model", disable=not progress)
    model.train()
    for epoch in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            batch = [pairs[i] for i in order[start : start + batch_size]]
            n = len(batch)
            # chosen and rejected in one forward pass: rows 0..n-1 chosen, n..2n-1 rejected
            ids, mask = encode(tokenizer, [p.prompt for p in batch] * 2, [p.chosen for p in batch]
                               + [p.rejected for p in batch], device)  # fmt: skip
            r = model.score(ids, mask)  # (2n,)
            loss = bradley_terry_loss(r[:n], r[n:]).mean()  # Ouyang et al. 2022 Eq. 1
            _validate.check_finite(len(history) + 1, CAUSES, loss=loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            _validate.check_finite(len(history) + 1, CAUSES, gradient_norm=grad_norm)
            optimizer.step()
            with torch.no_grad():
                margin = r[:n] - r[n:]  # (n,)
            history.log(epoch=epoch, loss=loss.item(), accuracy=(margin > 0).float().mean().item(),
                        margin=margin.mean().item(), grad_norm=grad_norm.item())  # fmt: skip
            bar.update(1)
            bar.set_postfix({"loss": f"{loss.item():.3f}"}, refresh=False)
    bar.close()
    model.eval()
    return history


CAUSES = "a learning rate too high (lr) or a starting checkpoint with non-finite weights; lower lr"


# --- saving and loading ---


def save_scalar_lm(model: ScalarLM, tokenizer, path: str | os.PathLike, metadata: dict | None = None) -> Path:
    """Write ``model`` whole into the folder ``path`` (new, empty, or one minirl wrote): weights as safetensors, the
    trunk's config, the tokenizer and ``minirl.json``."""

    def fill(folder: Path) -> None:
        save_model(model, str(folder / "model.safetensors"))
        model.trunk.config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        record = {"written_by": "minirl", "kind": KIND, **(metadata or {})}
        (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n")

    return write_folder(path, fill, MARKER)


def load_scalar_lm(path: str | os.PathLike, device: str | torch.device = "auto") -> tuple[ScalarLM, object]:
    """``(model, tokenizer)`` from a folder ``save_scalar_lm`` wrote; every weight must match, none missing or extra."""
    path = Path(path)
    record = json.loads((path / MARKER).read_text()) if (path / MARKER).is_file() else {}
    if record.get("kind") != KIND:
        raise ValueError(
            f"{path} is not a reward or value model checkpoint (its {MARKER} does not say kind {KIND!r}); train one "
            "with `minirl lm reward-model` or minirl.lm.reward_model.train"
        )
    config = AutoConfig.from_pretrained(path)
    model = ScalarLM(AutoModel.from_config(config))
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}/model.safetensors does not match its config.json: missing {sorted(missing)[:4]}, unexpected "
            f"{sorted(unexpected)[:4]}. A checkpoint loads whole or not at all"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(resolve_device(device)).eval(), tokenizer


def check_same_vocab(what: str, tokenizer, other_tokenizer, model: ScalarLM | None = None) -> None:
    """Raise unless ``other_tokenizer`` (of the reward or value model ``what``) is the policy's ``tokenizer``: a model
    that reads token ids must number the tokens the same way."""
    if tokenizer.get_vocab() != other_tokenizer.get_vocab():
        raise ValueError(
            f"the {what} reads another vocabulary than the policy ({len(other_tokenizer)} tokens vs "
            f"{len(tokenizer)}, or the same count numbered differently): its scores of the policy's token ids would be "
            f"meaningless. Train the {what} from the policy's own checkpoint (minirl lm reward-model --model ...)"
        )
    if model is not None and model.vocab_size < len(tokenizer):
        raise ValueError(f"the {what} embeds {model.vocab_size} tokens, fewer than the tokenizer's {len(tokenizer)}")


# --- the reward-model stage: sample, label, fit, measure ---


@dataclass
class RewardModelResult:
    """``model`` (the reward model), ``tokenizer``, ``history`` (one row per minibatch), the pairs of each side and
    the pairwise accuracies."""

    model: ScalarLM
    tokenizer: object
    history: History
    train_pairs: list[Pair]
    heldout_pairs: list[Pair]
    train_accuracy: float
    heldout_accuracy: float
    seconds: dict = field(default_factory=dict)


def check_config(cfg: RewardModelConfig) -> RewardModelConfig:
    positive = ("n_prompts", "completions_per_prompt", "pairs_per_prompt", "epochs", "batch_size", "lr",
                "max_grad_norm")  # fmt: skip
    _validate.check_config(cfg, positive, ("threads", "seed"), ("heldout",), {"task": tuple(TASKS)})
    if not cfg.noise < 0.5 or cfg.noise < 0:
        raise ValueError(f"noise must be in [0, 0.5), got {cfg.noise!r}: at 0.5 the labels say nothing")
    if cfg.completions_per_prompt < 2:
        raise ValueError("completions_per_prompt must be >= 2: a pair compares two completions of one prompt")
    return cfg


def train(cfg: RewardModelConfig, progress: bool = False) -> RewardModelResult:
    """RLHF's second stage: sample completions from ``cfg.model``, label pairs by the hidden utility
    (``preferences``), fit a reward model on the trunk of ``cfg.model``, measure held-out pairwise accuracy, normalise
    its scores, and save it to ``cfg.out``."""
    check_config(cfg)
    if cfg.out:
        from minirl._io import refuse_foreign

        refuse_foreign(Path(cfg.out), MARKER, "reward model")  # before any work: a refusal costs nothing
    use_threads(cfg.threads)
    device = resolve_device(cfg.device)
    task = get_task(cfg.task)
    lm, tokenizer = load(cfg.model, device=device)
    t0 = time.perf_counter()
    pairs = make_pairs(lm, tokenizer, task, cfg.n_prompts, cfg.completions_per_prompt, cfg.pairs_per_prompt,
                       cfg.noise, seed=cfg.seed)  # fmt: skip
    train_pairs, heldout_pairs = split_pairs(pairs, cfg.heldout, cfg.seed)
    check_pairs(train_pairs)
    t1 = time.perf_counter()
    check_vocab(lm, tokenizer)
    model = ScalarLM.from_lm(lm).to(device)
    history = fit(model, tokenizer, train_pairs, cfg.epochs, cfg.batch_size, cfg.lr, cfg.seed, cfg.max_grad_norm,
                  progress)  # fmt: skip
    t2 = time.perf_counter()
    texts = [(p.prompt, c) for p in train_pairs for c in (p.chosen, p.rejected)]
    normalize_head(model, tokenizer, [t[0] for t in texts], [t[1] for t in texts])
    train_acc = pairwise_accuracy(model, tokenizer, train_pairs)
    held_acc = pairwise_accuracy(model, tokenizer, heldout_pairs) if heldout_pairs else math.nan
    if cfg.out:
        meta = {"heldout_accuracy": held_acc, "train_accuracy": train_acc, "pairs": len(train_pairs),
                "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}}  # fmt: skip
        save_scalar_lm(model, tokenizer, cfg.out, meta)
    seconds = {"pairs_s": t1 - t0, "fit_s": t2 - t1}
    return RewardModelResult(model, tokenizer, history, train_pairs, heldout_pairs, train_acc, held_acc, seconds)
