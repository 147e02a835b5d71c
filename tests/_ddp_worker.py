"""Short runs of SFT, GRPO and RLHF-PPO on the committed checkpoint, for ``tests/test_distributed.py``.

Started by ``torchrun --nproc_per_node 2 tests/_ddp_worker.py OUT``, each run trains with DDP on 2 processes and rank
0 writes its parameters and history to OUT; imported by the test, the same functions run in one process.

Each process draws its own completions, so 2 processes would sample other text than 1. Here sampling is seeded per
prompt instead (``sample_per_prompt``): a group gets the same completions whichever process draws it, and the test
compares the update itself.
"""

import json
import sys
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from minirl.lm import PRETRAINED, distributed, grpo, load, rlhf, sampling, sft
from minirl.lm.config import PRETRAINED_RM, GRPOConfig, RLHFConfig
from minirl.lm.tasks import get_task, make_problems

TASK = get_task("addition")


def sample_per_prompt(model, tokenizer, prompts, max_new_tokens, temperature=1.0, generator=None) -> sampling.Samples:
    """``sampling.sample`` group by group (runs of equal prompts), each from a generator seeded by its prompt's text;
    the rows joined with the sampler's padding (prompts on the left, completions on the right)."""
    starts = [i for i in range(len(prompts)) if i == 0 or prompts[i] != prompts[i - 1]] + [len(prompts)]
    parts = []
    for a, b in zip(starts, starts[1:]):
        gen = torch.Generator(next(model.parameters()).device).manual_seed(zlib.crc32(prompts[a].encode()))
        parts.append(sampling.sample(model, tokenizer, prompts[a:b], max_new_tokens, temperature, generator=gen))
    P = max(s.prompt_ids.shape[1] for s in parts)
    C = max(s.completion_ids.shape[1] for s in parts)

    def joined(name: str, width: int, left: bool, value) -> torch.Tensor:
        tensors = [getattr(s, name) for s in parts]
        pads = [(width - t.shape[1], 0) if left else (0, width - t.shape[1]) for t in tensors]
        return torch.cat([torch.nn.functional.pad(t.float(), pad, value=value).to(t.dtype) for t, pad in
                          zip(tensors, pads)])  # fmt: skip

    pad = tokenizer.pad_token_id
    return sampling.Samples(
        prompt_ids=joined("prompt_ids", P, True, pad),
        prompt_mask=joined("prompt_mask", P, True, 0),
        completion_ids=joined("completion_ids", C, False, pad),
        completion_mask=joined("completion_mask", C, False, 0),
        logp=joined("logp", C, False, 0.0),
        truncated=torch.cat([s.truncated for s in parts]),
        text=[t for s in parts for t in s.text],
    )


@contextmanager
def per_prompt_sampling():
    """GRPO and RLHF sample with ``sample_per_prompt`` inside the block."""
    saved = grpo.sample, rlhf.sample
    grpo.sample = rlhf.sample = sample_per_prompt
    try:
        yield
    finally:
        grpo.sample, rlhf.sample = saved


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}  # clones: tied weights apart


def run_sft():
    """Two SFT steps of 4 examples each (2 per process)."""
    model, tokenizer = load(PRETRAINED, device="cpu")
    cfg = sft.SFTConfig(steps=2, batch_size=4, lr=1e-4, warmup_steps=0, schedule="constant", eval_every=100)
    result = sft.train(model, tokenizer, make_problems(TASK, "train", 12, seed=0), cfg)
    return params(result.model), result.history


def spread_reward_for(problems):
    """A user reward with spread in every group of ``problems`` and 0 elsewhere: with 2 processes the second has no
    row with signal, and joins the gradient average with a zero."""
    prompts = {p.prompt for p in problems}

    def reward(prompts_, completions, answers):
        return [float(sum(map(ord, c)) % 7) if p in prompts else 0.0 for p, c in zip(prompts_, completions)]

    return reward


def run_grpo_idle():
    """GRPO's defaults (beta 0, rows without signal skipped) where only the first 2 of 4 prompts carry a reward."""
    cfg = GRPOConfig(steps=1, prompts_per_step=4, group_size=4, accuracy_weight=0.0, eval_every=0, device="cpu",
                     threads=1)  # fmt: skip
    first_half = grpo.draw_problems(TASK, 4, cfg.seed, 0)[:2]
    with per_prompt_sampling():
        result = grpo.train(cfg, reward_fn=spread_reward_for(first_half))
    return params(result.model), result.history.rows


def run_grpo_kl():
    """GRPO with a KL to the reference, DAPO's token-mean, the batch std, and 2 iterations (clipping can act)."""
    cfg = GRPOConfig(steps=1, prompts_per_step=4, group_size=4, beta=0.04, loss_agg="token-mean", scale="batch",
                     iterations=2, eval_every=0, device="cpu", threads=1)  # fmt: skip
    with per_prompt_sampling():
        result = grpo.train(cfg)
    return params(result.model), result.history.rows


def run_rlhf():
    """One PPO step of 8 prompts in 2 minibatches (4 prompts per process), policy and critic trained."""
    cfg = RLHFConfig(reward_model=str(PRETRAINED_RM), steps=1, prompts_per_step=8, epochs=1, minibatches=2,
                     eval_every=0, device="cpu", threads=1)  # fmt: skip
    with per_prompt_sampling():
        result = rlhf.train(cfg)
    value = {f"value.{k}": v for k, v in params(result.value_model).items()}
    return {**params(result.model), **value}, result.history.rows


RUNS = {"sft": run_sft, "grpo_idle": run_grpo_idle, "grpo_kl": run_grpo_kl, "rlhf": run_rlhf}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or RUNS:
        t0 = time.perf_counter()
        weights, history = RUNS[name]()
        seconds = time.perf_counter() - t0
        if distributed.is_main():
            save_file(weights, out / f"{name}.safetensors")
            (out / f"{name}.json").write_text(json.dumps({"history": history, "seconds": seconds}))
