"""minirl PPO against Stable-Baselines3 PPO on CartPole-v1, with the rl-baselines3-zoo settings, side by side.

    pip install -e ".[bench]"
    python benchmarks/cartpole.py                  # 3 seeds x 100k steps each, three runs per seed, about 3 minutes
    python benchmarks/cartpole.py --seeds 0 --steps 20000

minirl runs twice per seed, with autograd and with ``hand_grad=True`` (the chain rule written out). All runs are
in this process at one thread, alternating per seed, and are evaluated by the same loop (20 deterministic
episodes). Wall time covers building the envs and the model and training. Writes
``benchmarks/results/cartpole.md`` and ``figures/benchmark_cartpole.png``.
"""

import argparse
import statistics
import time

import gymnasium as gym
import matplotlib
import numpy as np
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from _floor import floors, mlp_flops, mlp_kernel_seconds
from _stamp import RESULTS, stamp
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from minirl.algos import ppo
from minirl.plotting import save_figure
from minirl.rollout import evaluate

ENV = "CartPole-v1"
HAND = "minirl hand_grad"  # PPOConfig(hand_grad=True): the update's gradient by the chain rule, not autograd
LIBS = ("minirl", HAND, "SB3")


def linear(start: float):
    """The zoo's ``lin_x`` schedule: x times the fraction of training left."""
    return lambda progress_remaining: start * progress_remaining


def sb3_model(seed: int) -> PPO:
    """SB3 PPO with the rl-baselines3-zoo CartPole-v1 hyperparameters (hyperparams/ppo.yml)."""
    env = make_vec_env(ENV, n_envs=8, seed=seed)
    return PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )


def assert_same_hyperparameters(model: PPO, cfg: ppo.PPOConfig) -> None:
    """Every knob that changes the math, read back from both sides."""
    pairs = {
        "envs": (model.n_envs, cfg.num_envs),
        "n_steps": (model.n_steps, cfg.n_steps),
        "minibatch": (model.batch_size, cfg.minibatch_size),
        "epochs": (model.n_epochs, cfg.epochs),
        "gamma": (model.gamma, cfg.gamma),
        "lambda": (model.gae_lambda, cfg.lam),
        "lr at start, halfway": ((model.lr_schedule(1.0), model.lr_schedule(0.5)), (cfg.lr, cfg.lr * 0.5)),
        "clip at start, halfway": ((model.clip_range(1.0), model.clip_range(0.5)), (cfg.clip_low, cfg.clip_low * 0.5)),
        "anneal": (True, cfg.anneal_lr and cfg.anneal_clip),
        "ent_coef": (model.ent_coef, cfg.ent_coef),
        # SB3's value loss is vf_coef * MSE, minirl's vf_coef * 0.5 * MSE (losses.value_loss): equal weights on MSE
        "weight on the value MSE": (model.vf_coef, 0.5 * cfg.vf_coef),
        "max_grad_norm": (model.max_grad_norm, cfg.max_grad_norm),
        "normalize advantage": (model.normalize_advantage, cfg.norm_adv),
        "value clipping": (model.clip_range_vf, cfg.clip_vf),
        "hidden": (tuple(model.policy.net_arch["pi"]), tuple(cfg.hidden)),
        "critic hidden": (tuple(model.policy.net_arch["vf"]), tuple(cfg.hidden)),
        "adam eps": (model.policy.optimizer.defaults["eps"], 1e-5),
    }
    mismatched = {k: v for k, v in pairs.items() if v[0] != v[1]}
    assert not mismatched, f"hyperparameters differ (SB3, minirl): {mismatched}"


class Curve(BaseCallback):
    """Running mean of the last 20 episode returns at the end of each rollout, and time spent in rollouts."""

    def __init__(self) -> None:
        super().__init__()
        self.steps, self.returns, self.rollout_s, self._t = [], [], 0.0, 0.0

    def _on_rollout_start(self) -> None:
        self._t = time.perf_counter()

    def _on_rollout_end(self) -> None:
        self.rollout_s += time.perf_counter() - self._t
        episodes = [info["r"] for info in self.model.ep_info_buffer][-20:]
        self.steps.append(self.num_timesteps)
        self.returns.append(float(np.mean(episodes)) if episodes else float("nan"))

    def _on_step(self) -> bool:
        return True


def evaluate_sb3(model: PPO, episodes: int = 20, seed: int = 1000) -> tuple[float, float]:
    """The same protocol as ``minirl.evaluate``: episode i reset with seed + i, deterministic actions."""
    env, returns = gym.make(ENV), []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            act, _ = model.predict(obs, deterministic=True)
            obs, rew, terminated, truncated, _ = env.step(int(act))
            total += float(rew)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows, curves = [], {lib: [] for lib in LIBS}
    for seed in args.seeds:
        for lib, hand_grad in (("minirl", False), (HAND, True)):
            cfg = ppo.PPOConfig(env_id=ENV, total_steps=args.steps, seed=seed, vf_coef=1.0, hand_grad=hand_grad)
            assert_same_hyperparameters(sb3_model(seed), cfg)  # vf_coef 1.0: SB3's 0.5 on its MSE
            t0 = time.perf_counter()
            result = ppo.train(cfg)
            wall = time.perf_counter() - t0
            mean, std = evaluate(result.policy, ENV, episodes=20, seed=1000)
            h = result.history
            rows.append((lib, seed, wall, mean, std, sum(h["rollout_s"]), sum(h["update_s"])))
            curves[lib].append((h["step"], h["return_mean"]))

        t0 = time.perf_counter()
        model, curve = sb3_model(seed), Curve()
        model.learn(total_timesteps=args.steps, callback=curve)
        wall = time.perf_counter() - t0
        mean, std = evaluate_sb3(model)
        rows.append(("SB3", seed, wall, mean, std, curve.rollout_s, wall - curve.rollout_s))
        curves["SB3"].append((curve.steps, curve.returns))
        print(*rows[-3:], sep="\n", flush=True)

    write_table(rows, args, profile_update(), compare_backward(), ppo_floor(ppo.PPOConfig(total_steps=args.steps)))
    plot(curves, f"PPO on {ENV}, zoo settings, {len(args.seeds)} seeds", "benchmark_cartpole")


def profile_update(repeats: int = 1000) -> list[tuple[str, float]]:
    """Microseconds per minibatch update of minirl's PPO (256 transitions, two 64-64 MLPs), phase by phase."""
    from minirl._validate import finite_checked
    from minirl.algos.common import adam_step, clip_grad_norm, one_buffer
    from minirl.losses import ppo_clip_loss, value_loss
    from minirl.policies import Policy, spec_for

    torch.manual_seed(0)
    policy = Policy(spec_for(gym.make(ENV)))
    obs, act = torch.randn(256, 4), torch.randint(0, 2, (256,))
    old_logp, adv, ret = torch.randn(256) - 0.7, torch.randn(256), torch.randn(256)
    timings = dict.fromkeys(["forward + losses", "backward", "grad-norm clip", "Adam step"], 0.0)
    with one_buffer(policy) as flat:  # as in ppo.train: Adam and the clip see the parameters as one tensor
        opt = torch.optim.Adam([flat], lr=1e-3, eps=1e-5, fused=True)
        for _ in range(repeats):
            t0 = time.perf_counter()
            with finite_checked():  # as in ppo.train: the batch was checked once, ent_coef = 0 leaves entropy out
                dist = policy.distribution(obs, normalized=True)
                logp = policy.log_prob(dist, act)
                loss = ppo_clip_loss(logp, old_logp, adv, 0.2).mean() + value_loss(policy.value(obs), ret).mean()
            t1 = time.perf_counter()
            flat.grad.zero_()
            loss.backward()
            t2 = time.perf_counter()
            clip_grad_norm([flat], 0.5)
            t3 = time.perf_counter()
            adam_step(opt)  # as in ppo.update
            t4 = time.perf_counter()
            for key, dt in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                timings[key] += dt
    return [(k, 1e6 * v / repeats) for k, v in timings.items()]


def compare_backward(repeats: int = 2000) -> dict[str, float]:
    """Microseconds per whole minibatch update (256 transitions, two 64-64 MLPs; the loss, its gradient, the clip
    and Adam), with autograd and with ``hand_grad=True``, alternating in blocks of 100 so that drift hits both."""
    from minirl._validate import finite_checked
    from minirl.algos.common import adam_step, check_gradient, clip_grad_norm, one_buffer
    from minirl.policies import Policy, spec_for

    torch.manual_seed(0)
    policy = Policy(spec_for(gym.make(ENV)))
    mb_b = {"obs": torch.randn(256, 4), "act": torch.randint(0, 2, (256,)), "logp": torch.randn(256) - 0.7}
    mb_b |= {"adv": torch.randn(256), "ret": torch.randn(256), "val": torch.randn(256)}
    cfg, clip = ppo.PPOConfig(vf_coef=1.0), (0.2, None)
    totals = {"autograd": 0.0, "hand_grad": 0.0}
    with one_buffer(policy) as flat, finite_checked():
        opt = torch.optim.Adam([flat], lr=1e-4, eps=1e-5, fused=True)
        for block in range(2 * repeats // 100):
            name = ("autograd", "hand_grad")[block % 2]
            backward = ppo.autograd_backward if name == "autograd" else ppo.hand_backward
            t0 = time.perf_counter()
            for _ in range(100):
                flat.grad.zero_()
                backward(policy, mb_b, cfg, clip)
                check_gradient(0, clip_grad_norm([flat], cfg.max_grad_norm))
                adam_step(opt)  # the minibatch step of ppo.update
            totals[name] += time.perf_counter() - t0
    return {name: 1e6 * total / repeats for name, total in totals.items()}


def ppo_floor(cfg: ppo.PPOConfig) -> tuple[float, float, str]:
    """The floors (``_floor``) of one run: acting (the actor on N observations per step), one batched actor + critic
    pass over each rollout, and forward + backward of both networks on every minibatch of every epoch."""
    a_sizes, c_sizes = [4, *cfg.hidden, 2], [4, *cfg.hidden, 1]
    batch = cfg.num_envs * cfg.n_steps
    rollouts = cfg.total_steps // batch
    minibatches = rollouts * cfg.epochs * (batch // cfg.minibatch_size)
    flops = cfg.total_steps * (2 * mlp_flops(a_sizes) + mlp_flops(c_sizes))
    flops += minibatches * cfg.minibatch_size * 3 * (mlp_flops(a_sizes) + mlp_flops(c_sizes))
    kernels = (cfg.total_steps // cfg.num_envs) * mlp_kernel_seconds(a_sizes, cfg.num_envs, backward=False)
    kernels += rollouts * sum(mlp_kernel_seconds(s, batch, backward=False) for s in (a_sizes, c_sizes))
    kernels += minibatches * sum(mlp_kernel_seconds(s, cfg.minibatch_size, backward=True) for s in (a_sizes, c_sizes))
    return floors(flops, kernels, cfg.total_steps, ENV)


def write_table(rows, args, profile, backward, floor) -> None:
    lines = [
        f"# PPO on {ENV}: minirl vs Stable-Baselines3",
        "",
        stamp(),
        f"rl-baselines3-zoo settings, {args.steps} steps, seeds {args.seeds}, one thread each; "
        "evaluation: 20 deterministic episodes.",
        "",
        "| library | seed | wall (s) | env steps/s | rollout (s) | update (s) | eval return |",
        "|---|---|---|---|---|---|---|",
    ]
    for lib, seed, wall, mean, std, roll, upd in rows:
        lines.append(
            f"| {lib} | {seed} | {wall:.1f} | {args.steps / wall:,.0f} | {roll:.1f} | {upd:.1f} | "
            f"{mean:.1f} ± {std:.1f} |"
        )
    med = {lib: statistics.median(r[2] for r in rows if r[0] == lib) for lib in LIBS}
    evals = {lib: statistics.median(r[3] for r in rows if r[0] == lib) for lib in LIBS}
    wall = {(r[0], r[1]): r[2] for r in rows}
    seeds = sorted({r[1] for r in rows})
    paired = [(seed, {lib: wall[lib, seed] / wall["SB3", seed] for lib in LIBS}) for seed in seeds]
    lines += [
        "",
        f"Median wall time: minirl {med['minirl']:.1f} s, {HAND} {med[HAND]:.1f} s, SB3 {med['SB3']:.1f} s; "
        f"ratio minirl / SB3 = **{med['minirl'] / med['SB3']:.2f}x**, {HAND} / SB3 = "
        f"**{med[HAND] / med['SB3']:.2f}x** (target 0.4x). Median evaluation return: "
        + ", ".join(f"{lib} {evals[lib]:.1f}" for lib in LIBS)
        + ".",
        "Each seed's wall time over SB3's on the same seed (the three run back to back, so a slow spell of the "
        "machine mostly hits all three): "
        + "; ".join(f"seed {seed}: minirl {walls['minirl']:.2f}x, {HAND} {walls[HAND]:.2f}x" for seed, walls in paired)
        + ".",
        f"{HAND} is `PPOConfig(hand_grad=True)`: the same loss, its gradient by the chain rule written out "
        "(`minirl.backprop`, `ppo.hand_backward`) instead of autograd; the same run otherwise.",
        "Value loss: minirl runs with vf_coef 1.0 on its 0.5 * MSE, SB3 with 0.5 on its MSE: the same loss.",
        "",
        f"{floor[2]} minirl's median is {med['minirl'] / floor[1]:.1f}x the kernel floor, {HAND}'s "
        f"{med[HAND] / floor[1]:.1f}x, SB3's {med['SB3'] / floor[1]:.1f}x.",
        "SB3's rollout time is measured by a callback between rollout start and end; its update time is the rest.",
        "",
        "Where minirl's update time goes: one minibatch update (256 transitions, actor and critic 64-64 MLPs), "
        f"{sum(us for _, us in profile):.0f} us in all:",
        "",
        "| phase | us per update |",
        "|---|---|",
        *[f"| {phase} | {us:.0f} |" for phase, us in profile],
        "",
        f"The whole minibatch update, the two paths alternating: autograd {backward['autograd']:.0f} us, hand_grad "
        f"{backward['hand_grad']:.0f} us ({backward['hand_grad'] / backward['autograd']:.2f}x).",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cartpole.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(curves: dict, title: str, name: str) -> None:
    """Learning curves of both libraries (``curves[lib]`` is a list of (steps, returns) per seed), saved as
    ``figures/<name>.png``."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for (lib, runs), color in zip(curves.items(), ("tab:blue", "tab:green", "tab:orange")):
        for i, (steps, rets) in enumerate(runs):
            ax.plot(steps, rets, color=color, alpha=0.8, lw=1.3, label=lib if i == 0 else None)
    ax.axhline(500, color="gray", ls=":", lw=1)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return (mean of last 20 episodes)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, name)


if __name__ == "__main__":
    main()
