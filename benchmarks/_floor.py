"""What the hardware allows: a floor for a training run from its work (matrix FLOPs, env steps) and this CPU's
measured throughput at one thread.

The floor assumes every matrix product runs at the speed of one large product and every env step at the speed of
the bare env with no learner around it: no framework overhead, no Python between the calls. Real runs of these tiny
networks sit well above it, because their matrices are small (64 x 64) and each call's fixed cost dominates.
"""

import time

import gymnasium as gym
import torch


def matmul_gflops(n: int = 512, repeats: int = 50) -> float:
    """fp32 GFLOP/s of one (n x n) @ (n x n) product at the current thread count: the best of ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def env_seconds_per_step(env_id: str, steps: int = 20_000) -> float:
    """Seconds per step of ``gym.make(env_id)`` with random actions, resets included."""
    env = gym.make(env_id)
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(steps)]
    t0 = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return (time.perf_counter() - t0) / steps


def mlp_flops(sizes: list[int]) -> int:
    """Matrix FLOPs of one forward pass of an MLP with layer sizes ``sizes`` for one sample (2 per multiply-add)."""
    return sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:]))


def floor_line(name: str, flops: float, env_steps: int, env_id: str) -> tuple[float, str]:
    """The floor in seconds and a sentence that shows how it was reached."""
    gflops, per_step = matmul_gflops(), env_seconds_per_step(env_id)
    compute, env = flops / (gflops * 1e9), env_steps * per_step
    line = (
        f"Floor for {name}: {flops / 1e9:.1f} GFLOP of matrix products at {gflops:.0f} GFLOP/s (one 512 x 512 fp32 "
        f"product at one thread) = {compute:.2f} s, plus {env_steps:,} env steps at {per_step * 1e6:.1f} us (the bare "
        f"{env_id} with random actions) = {env:.2f} s; in all **{compute + env:.1f} s**."
    )
    return compute + env, line
