"""What the hardware allows: floors for a training run from its work and this CPU's measured speed at one thread.

Two floors, both with the env steps at the speed of the bare env (no learner around it):

- peak: every matrix product at the speed of one large (512 x 512) product. Tiny networks never get there.
- kernels: the run's own matrix products and activations (tanh, ReLU), at their real shapes, timed back to back with no
  autograd, optimizer or Python logic between them. What is left above it is the cost of running the algorithm
  through a framework: dispatch, autograd bookkeeping, the optimizer's and the losses' small operations.
"""

import time

import gymnasium as gym
import torch


def best_time(fn, repeats: int = 200) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn()`` (after 20 warm-up calls)."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_gflops(n: int = 512) -> float:
    """fp32 GFLOP/s of one (n x n) @ (n x n) product at the current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_time(lambda: torch.mm(a, b), repeats=50) / 1e9


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


# an activation and its derivative's kernel (given the upstream gradient and the activation's output)
ACTIVATIONS = {
    "tanh": (torch.tanh, torch.ops.aten.tanh_backward),
    "relu": (torch.relu, lambda g, y: torch.ops.aten.threshold_backward(g, y, 0)),
}


def mlp_kernel_seconds(sizes: list[int], batch: int, backward: bool, activation: str = "tanh") -> float:
    """The kernels of one pass of a (sizes) MLP on ``batch`` samples, timed without autograd: per layer the product
    (and the activation between layers); with ``backward`` also the two products of its gradient (for the weights,
    and for the layer's input except at the first layer) and the activation's derivative."""
    xs = [torch.randn(batch, n) for n in sizes]  # the layers' inputs and outputs
    ws = [torch.randn(o, i) for i, o in zip(sizes[:-1], sizes[1:])]
    bs = [torch.randn(o) for o in sizes[1:]]
    act, act_backward = ACTIVATIONS[activation]

    def run() -> None:
        for k, (w, b) in enumerate(zip(ws, bs)):
            h = torch.addmm(b, xs[k], w.t())
            if k < len(ws) - 1:
                act(h)
        if backward:
            for k in reversed(range(len(ws))):
                g = xs[k + 1]  # (batch, out), a stand-in for the gradient of this layer's output
                torch.mm(g.t(), xs[k])  # (out, in): the weight gradient
                if k > 0:
                    torch.mm(g, ws[k])  # (batch, in): the input gradient
                    act_backward(xs[k], xs[k])

    return best_time(run)


def floors(flops: float, kernel_s: float, env_steps: int, env_id: str) -> tuple[float, float, str]:
    """The peak and kernel floors in seconds, and a sentence that shows how they were reached."""
    gflops, per_step = matmul_gflops(), env_seconds_per_step(env_id)
    env = env_steps * per_step
    peak = flops / (gflops * 1e9)
    line = (
        f"Floors: {env_steps:,} env steps at {per_step * 1e6:.1f} us (the bare {env_id}, random actions) = "
        f"{env:.2f} s, plus either {flops / 1e9:.1f} GFLOP at {gflops:.0f} GFLOP/s (a 512 x 512 fp32 product, one "
        f"thread) = {peak:.2f} s (**peak floor {env + peak:.1f} s**), or the run's own matrix products and activations "
        f"at their real shapes, timed back to back without autograd = {kernel_s:.2f} s "
        f"(**kernel floor {env + kernel_s:.1f} s**)."
    )
    return env + peak, env + kernel_s, line
