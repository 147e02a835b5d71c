"""gymnasium's AsyncVectorEnv (one subprocess per env) against SyncVectorEnv (the envs stepped in turn), as minirl's
collector uses them: when does stepping the envs in parallel pay?

    python benchmarks/vector_envs.py                   # about 2 minutes
    python benchmarks/vector_envs.py --envs 2 8 --costs 0 200 1000

Each cell collects the same number of transitions with ``minirl.rollout.Collector`` and a fresh PPO policy, on
CartPole-v1 whose every step also burns ``cost`` microseconds of CPU (a stand-in for a heavier simulator). Writes
``benchmarks/results/vector_envs.md``.
"""

import argparse
import os
import time

import gymnasium as gym
import torch
from _stamp import RESULTS, stamp

from minirl.policies import Policy, spec_for
from minirl.rollout import Collector


class Costly(gym.Wrapper):
    """CartPole whose step also spins the CPU for ``cost_us`` microseconds, like a heavier physics step."""

    def __init__(self, env: gym.Env, cost_us: int):
        super().__init__(env)
        self.cost = cost_us * 1e-6

    def step(self, action):
        end = time.perf_counter() + self.cost
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


def make_costly(cost_us: int = 0) -> gym.Env:
    return Costly(gym.make("CartPole-v1"), cost_us)


gym.register("minirl-bench/CostlyCartPole-v1", entry_point=make_costly)


def steps_per_second(num_envs: int, cost_us: int, asynchronous: bool, transitions: int) -> float:
    """Transitions per second of ``Collector.collect`` (env start-up excluded)."""
    # as minirl.rollout.make_envs builds them (SAME_STEP autoreset), with the cost passed to every env
    envs = gym.make_vec(
        "minirl-bench/CostlyCartPole-v1",
        num_envs=num_envs,
        vectorization_mode="async" if asynchronous else "sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        cost_us=cost_us,
    )
    try:
        collector = Collector(envs, seed=0)
        policy = Policy(spec_for(envs))
        collector.collect(policy, 8)  # warm-up: subprocesses started, first calls paid
        steps = max(1, transitions // num_envs)
        t0 = time.perf_counter()
        collector.collect(policy, steps)
        return steps * num_envs / (time.perf_counter() - t0)
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--costs", type=int, nargs="+", default=[0, 100, 1000], help="extra CPU per env step (us)")
    parser.add_argument("--transitions", type=int, default=8192)
    args = parser.parse_args()
    torch.set_num_threads(1)

    lines = [
        "# AsyncVectorEnv vs SyncVectorEnv in minirl's collector",
        "",
        stamp(("torch", "gymnasium")),
        f"{os.cpu_count()} CPU cores. {args.transitions} transitions per cell collected by `minirl.rollout.Collector` "
        "(a fresh 64-64 PPO policy), CartPole-v1 plus a busy wait of `cost` us in every env step.",
        "",
        "| envs | env cost (us/step) | sync (steps/s) | async (steps/s) | async / sync |",
        "|---|---|---|---|---|",
    ]
    for cost in args.costs:
        for n in args.envs:
            sync = steps_per_second(n, cost, False, args.transitions)
            asyn = steps_per_second(n, cost, True, args.transitions)
            lines.append(f"| {n} | {cost} | {sync:,.0f} | {asyn:,.0f} | {asyn / sync:.2f}x |")
            print(lines[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vector_envs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
