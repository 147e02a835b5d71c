"""Does the LM half run right on a GPU, and how fast: ``python benchmarks/gpu_check.py`` (under 10 minutes on one GPU).

    python benchmarks/gpu_check.py                 # the checks, then 20 timed steps per trainer and device
    python benchmarks/gpu_check.py --steps 5 --model path/to/checkpoint

Checks, each an assert, on the committed checkpoint (or ``--model``):

1. Log-probs of one batch of sampled completions agree between the CPU (fp32) and the GPU: in fp32 within 1e-3 per
   token, and under the trainers' bf16 autocast within 0.05 on average over the completion tokens (bf16 keeps about 3
   significant digits of each logit). Both differences are printed.
2. The sampler on the GPU (its generator on the GPU) records the log-probs that an uncached ``logprobs`` of the same
   tokens gives, within 1e-3: what GRPO's ratio pi_theta / pi_old relies on.
3. One step of GRPO and one of RLHF-PPO with ``device="cuda"`` (bf16 autocast in the training forward): every logged
   loss finite, the parameters changed, and they are still on the GPU.

Then the speed: steps per second of SFT (batch 32) and GRPO (the trainer's defaults: 16 prompts x 8 completions) on
the GPU and on the CPU at one thread, each after one warm-up run that is not counted (CUDA start-up, kernel
selection). A GRPO step's time is its ``sample_s + train_s``; an SFT step's is the wall time of ``sft.train`` over the
steps. With CUDA the table goes to ``benchmarks/results/gpu_check.md``, stamped with the commit, CPU, GPU and date.

Without CUDA the script says so and runs a short CPU version (2 steps, the checks compare the CPU with itself), so
that the script itself stays tested; it writes no table.
"""

import argparse
import math
import time

import torch
from _stamp import RESULTS, stamp

from minirl.lm import PRETRAINED, grpo, load, rlhf, sft
from minirl.lm.config import PRETRAINED_RM, GRPOConfig, RLHFConfig
from minirl.lm.distributed import autocast
from minirl.lm.sampling import logprobs, sample
from minirl.lm.tasks import get_task, make_problems, token_budget

TASK = get_task("addition")


def completion_diff(a: torch.Tensor, b: torch.Tensor, cmask: torch.Tensor) -> tuple[float, float]:
    """Max and mean absolute difference of two (B, C) log-prob tensors over the completion tokens."""
    d = (a.float().cpu() - b.float().cpu()).abs()[cmask.cpu()]
    return d.max().item(), d.mean().item()


def check_logprobs(model_name: str, gpu: torch.device) -> dict:
    """Checks 1 and 2: the same batch scored on the CPU and on ``gpu``; the GPU sampler against a recomputation."""
    cpu_model, tokenizer = load(model_name, device="cpu")
    gpu_model = load(model_name, device=gpu)[0]
    prompts = [p.prompt for p in make_problems(TASK, "train", 64, seed=1)]
    budget = token_budget(TASK, tokenizer)
    smp = sample(cpu_model, tokenizer, prompts, budget, seed=0)
    P = smp.prompt_ids.shape[1]
    with torch.no_grad():
        ref = logprobs(cpu_model, smp.ids, smp.mask)[:, P:]  # (B, C) fp32 on the CPU
        fp32 = logprobs(gpu_model, smp.ids.to(gpu), smp.mask.to(gpu))[:, P:]  # (B, C)
        with autocast(gpu):
            bf16 = logprobs(gpu_model, smp.ids.to(gpu), smp.mask.to(gpu))[:, P:]  # (B, C)
    fp32_max, _ = completion_diff(ref, fp32, smp.completion_mask)
    bf16_max, bf16_mean = completion_diff(ref, bf16, smp.completion_mask)
    assert fp32_max < 1e-3, f"fp32 log-probs differ by {fp32_max:.2e} between the CPU and {gpu}"
    assert bf16_mean < 0.05, f"bf16 log-probs differ by {bf16_mean:.3f} on average from the CPU's fp32"

    generator = torch.Generator(gpu).manual_seed(0)  # the trainers' way: a generator on the model's device
    on_gpu = sample(gpu_model, tokenizer, prompts, budget, generator=generator)
    with torch.no_grad():
        again = logprobs(gpu_model, on_gpu.ids, on_gpu.mask)[:, on_gpu.prompt_ids.shape[1] :]  # (B, C)
    sampler_max, _ = completion_diff(on_gpu.logp, again, on_gpu.completion_mask)
    assert sampler_max < 1e-3, f"the sampler's log-probs differ by {sampler_max:.2e} from a recomputation on {gpu}"
    return {"fp32 max |diff|": fp32_max, "bf16 max |diff|": bf16_max, "bf16 mean |diff|": bf16_mean,
            "sampler vs recomputed, max |diff|": sampler_max}  # fmt: skip


def check_steps(model_name: str, gpu: torch.device) -> dict:
    """Check 3: one GRPO step and one RLHF-PPO step on ``gpu``."""
    start = load(model_name, device="cpu")[0].state_dict()
    results = {}
    runs = {
        "grpo": lambda: grpo.train(GRPOConfig(model=model_name, steps=1, eval_every=0, device=str(gpu), threads=1)),
        "rlhf": lambda: rlhf.train(RLHFConfig(model=model_name, reward_model=str(PRETRAINED_RM), steps=1,
                                              prompts_per_step=16, eval_every=0, device=str(gpu), threads=1)),
    }  # fmt: skip
    for name, run in runs.items():
        if name == "rlhf" and model_name != str(PRETRAINED):
            continue  # the committed reward model shares only the course's vocabulary
        result = run()
        row = result.history.rows[-1]
        losses = {k: row[k] for k in ("loss", "policy_loss", "value_loss") if k in row}
        assert all(math.isfinite(v) for v in losses.values()), f"{name}: a loss is not finite: {losses}"
        params = dict(result.model.named_parameters())
        assert all(p.device.type == gpu.type for p in params.values()), f"{name}: a parameter left {gpu}"
        moved = max((params[k].detach().cpu() - start[k]).abs().max().item() for k in params)
        assert moved > 0, f"{name}: one step on {gpu} left the parameters unchanged"
        results[name] = {**losses, "largest parameter change": moved}
    return results


def grpo_speed(model_name: str, device: torch.device, steps: int) -> float:
    """GRPO steps per second at the trainer's defaults, after a 1-step warm-up."""
    cfg = GRPOConfig(model=model_name, steps=1, eval_every=0, device=str(device), threads=1)
    grpo.train(cfg)
    rows = grpo.train(GRPOConfig(**{**vars(cfg), "steps": steps})).history.rows
    return steps / sum(r["sample_s"] + r["train_s"] for r in rows)


def sft_speed(model_name: str, device: torch.device, steps: int) -> float:
    """SFT steps per second at batch 32 on addition problems, after a 1-step warm-up."""
    examples = make_problems(TASK, "train", 512, seed=0)
    for n in (1, steps):
        model, tokenizer = load(model_name, device=device)
        cfg = sft.SFTConfig(steps=n, batch_size=32, lr=1e-4, eval_every=n)
        t0 = time.perf_counter()
        sft.train(model, tokenizer, examples, cfg)
        if device.type == "cuda":
            torch.cuda.synchronize()  # count the queued GPU work
        seconds = time.perf_counter() - t0
    return steps / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per trainer and device")
    parser.add_argument("--model", default=str(PRETRAINED), help="checkpoint folder or hub name")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the CPU side of the comparison, as every benchmark here
    has_gpu = torch.cuda.is_available()
    if has_gpu:
        gpu, steps = torch.device("cuda"), args.steps
        print(f"GPU: {torch.cuda.get_device_name(gpu)}")
    else:
        gpu, steps = torch.device("cpu"), 2
        print("No CUDA GPU here (torch.cuda.is_available() is False): running the short CPU version, in which the "
              "checks compare the CPU with itself and only show that the script runs. Run it on a machine with a "
              "GPU (and a CUDA build of torch) for the real check.")  # fmt: skip
    t0 = time.perf_counter()
    for name, value in check_logprobs(args.model, gpu).items():
        print(f"log-probs, {name}: {value:.2e}")
    for name, values in check_steps(args.model, gpu).items():
        print(f"one {name} step on {gpu}: " + ", ".join(f"{k} {v:.3g}" for k, v in values.items()))
    print(f"checks passed in {time.perf_counter() - t0:.0f} s")

    devices = [torch.device("cpu")] + ([gpu] if has_gpu else [])
    table = {(trainer, dev.type): fn(args.model, dev, steps) for trainer, fn in (("sft", sft_speed),
             ("grpo", grpo_speed)) for dev in devices}  # fmt: skip
    lines = ["| trainer | device | steps per second |", "|---|---|---|"]
    lines += [f"| {trainer} | {dev} | {rate:.2f} |" for (trainer, dev), rate in table.items()]
    if has_gpu:
        lines.append(f"\nPeak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB.")
    print("\n".join(lines))
    print(f"all done in {time.perf_counter() - t0:.0f} s")
    if has_gpu:
        header = f"# GPU check\n\n{stamp(('torch', 'transformers'))} GPU: {torch.cuda.get_device_name(gpu)}.\n\n"
        command = f"`python benchmarks/gpu_check.py --steps {steps} --model {args.model}`, CPU at one thread.\n\n"
        (RESULTS / "gpu_check.md").write_text(header + command + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
