"""minirl TRPO against sb3-contrib TRPO on CartPole-v1, with the rl-baselines3-zoo settings, side by side.

    pip install -e ".[bench]" "sb3-contrib>=2.3"
    python benchmarks/trpo_cartpole.py                  # 3 seeds x 100k steps each, both libraries, about 5 minutes
    python benchmarks/trpo_cartpole.py --seeds 0 --steps 20000
    python benchmarks/trpo_cartpole.py --profile        # also: where minirl's time goes (cProfile of one run)

Both sides run in this process at one thread, alternating per seed, and are evaluated by the same loop (20
deterministic episodes). Wall time covers building the envs and the model and training. Writes
``benchmarks/results/trpo_cartpole.md`` and ``figures/benchmark_trpo_cartpole.png``.
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import matplotlib
import torch

matplotlib.use("Agg")
from _floor import floors, mlp_flops, mlp_kernel_seconds
from _stamp import RESULTS, stamp
from cartpole import Curve, evaluate_sb3, plot
from sb3_contrib import TRPO
from stable_baselines3.common.env_util import make_vec_env

from minirl.algos import trpo
from minirl.rollout import evaluate

ENV = "CartPole-v1"


def sb3_model(seed: int) -> TRPO:
    """sb3-contrib TRPO with the rl-baselines3-zoo CartPole-v1 hyperparameters (hyperparams/trpo.yml)."""
    env = make_vec_env(ENV, n_envs=2, seed=seed)
    return TRPO(
        "MlpPolicy",
        env,
        n_steps=512,
        batch_size=512,
        cg_damping=1e-3,
        gae_lambda=0.98,
        gamma=0.99,
        learning_rate=1e-3,
        n_critic_updates=20,
        seed=seed,
        device="cpu",
        verbose=0,
    )


def assert_same_hyperparameters(model: TRPO, cfg: trpo.TRPOConfig) -> None:
    """Every knob that changes the math, read back from both sides."""
    pairs = {
        "envs": (model.n_envs, cfg.num_envs),
        "n_steps": (model.n_steps, cfg.n_steps),
        "critic minibatch": (model.batch_size, cfg.minibatch_size),
        "critic epochs": (model.n_critic_updates, cfg.value_epochs),
        "critic lr": (model.lr_schedule(1.0), cfg.value_lr),
        "critic lr at the end": (model.lr_schedule(0.0), cfg.value_lr),
        "gamma": (model.gamma, cfg.gamma),
        "lambda": (model.gae_lambda, cfg.lam),
        "KL radius": (model.target_kl, cfg.delta),
        "CG iterations": (model.cg_max_steps, cfg.cg_iters),
        "CG damping": (model.cg_damping, cfg.cg_damping),
        "line search shrink": (model.line_search_shrinking_factor, cfg.backtrack_coef),
        "line search tries": (model.line_search_max_iter, cfg.backtrack_iters),
        "line search": (True, cfg.line_search),
        "normalize advantage": (model.normalize_advantage, cfg.norm_adv),
        "sub-sampling": (model.sub_sampling_factor, 1),
        "obs normalisation": (False, cfg.obs_norm),
        "hidden": (tuple(model.policy.net_arch["pi"]), tuple(cfg.hidden)),
        "critic hidden": (tuple(model.policy.net_arch["vf"]), tuple(cfg.hidden)),
        "activation": (model.policy.activation_fn, torch.nn.Tanh),
        "orthogonal init": (model.policy.ortho_init, True),
        "adam eps": (model.policy.optimizer.defaults["eps"], 1e-5),
    }
    mismatched = {k: v for k, v in pairs.items() if v[0] != v[1]}
    assert not mismatched, f"hyperparameters differ (sb3-contrib, minirl): {mismatched}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true", help="also profile one minirl run (seed 0) with cProfile")
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows, curves = [], {"minirl": [], "sb3-contrib": []}
    for seed in args.seeds:
        cfg = trpo.TRPOConfig(env_id=ENV, total_steps=args.steps, seed=seed)
        assert_same_hyperparameters(sb3_model(seed), cfg)

        t0 = time.perf_counter()
        result = trpo.train(cfg)
        wall = time.perf_counter() - t0
        mean, std = evaluate(result.policy, ENV, episodes=20, seed=1000)
        h = result.history
        rows.append(("minirl", seed, wall, mean, std, sum(h["rollout_s"]), sum(h["policy_s"]), sum(h["critic_s"])))
        curves["minirl"].append((h["step"], h["return_mean"]))

        t0 = time.perf_counter()
        model, curve = sb3_model(seed), Curve()
        model.learn(total_timesteps=args.steps, callback=curve)
        wall = time.perf_counter() - t0
        mean, std = evaluate_sb3(model)
        rows.append(("sb3-contrib", seed, wall, mean, std, curve.rollout_s, wall - curve.rollout_s, None))
        curves["sb3-contrib"].append((curve.steps, curve.returns))
        print(rows[-2], rows[-1], flush=True)

    profile = minirl_profile(args.steps) if args.profile else None
    write_table(rows, args, profile, trpo_floor(trpo.TRPOConfig(total_steps=args.steps)))
    plot(curves, f"TRPO on {ENV}, zoo settings, {len(args.seeds)} seeds", "benchmark_trpo_cartpole")


def minirl_profile(steps: int) -> str:
    """The functions minirl spends most of its own time in, for one run at seed 0."""
    profiler = cProfile.Profile()
    profiler.enable()
    trpo.train(trpo.TRPOConfig(env_id=ENV, total_steps=steps, seed=0))
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(r"minirl/|sync_vector_env|cartpole.py|run_backward|optim/adam", 22)
    return out.getvalue()


def trpo_floor(cfg: trpo.TRPOConfig) -> tuple[float, float, str]:
    """The floors (``_floor``) of one run. Per batch of B transitions: acting (the actor on N observations per
    step), one batched actor + critic pass, the policy gradient (an actor forward and backward), each Fisher-vector
    product of CG and of the step size (the KL's gradient, then its gradient again: counted as two forward and
    backward passes), two line-search measurements, and forward + backward of the critic on every minibatch of every
    critic epoch."""
    a_sizes, c_sizes = [4, *cfg.hidden, 2], [4, *cfg.hidden, 1]
    batch = cfg.num_envs * cfg.n_steps
    rollouts = cfg.total_steps // batch
    a_fwd, c_fwd = mlp_flops(a_sizes), mlp_flops(c_sizes)
    fvps = cfg.cg_iters + 1
    flops = cfg.total_steps * (2 * a_fwd + c_fwd)
    flops += rollouts * batch * (a_fwd * (3 + 2 * 3 * fvps + 2) + c_fwd * 3 * cfg.value_epochs)
    kernels = (cfg.total_steps // cfg.num_envs) * mlp_kernel_seconds(a_sizes, cfg.num_envs, backward=False)
    a_pass, a_full = (mlp_kernel_seconds(a_sizes, batch, backward=b) for b in (False, True))
    c_pass = mlp_kernel_seconds(c_sizes, batch, backward=False)
    c_full = mlp_kernel_seconds(c_sizes, cfg.minibatch_size, backward=True)
    per_batch = a_pass + c_pass + a_full * (1 + 2 * fvps) + 2 * a_pass
    per_batch += c_full * cfg.value_epochs * (batch // cfg.minibatch_size)
    return floors(flops, kernels + rollouts * per_batch, cfg.total_steps, ENV)


def write_table(rows, args, profile: str | None, floor: tuple[float, float, str]) -> None:
    lines = [
        f"# TRPO on {ENV}: minirl vs sb3-contrib",
        "",
        stamp(("torch", "gymnasium", "stable-baselines3", "sb3-contrib")),
        f"rl-baselines3-zoo settings, {args.steps} steps, seeds {args.seeds}, one thread each; "
        "evaluation: 20 deterministic episodes.",
        "",
        "| library | seed | wall (s) | env steps/s | rollout (s) | policy step (s) | critic (s) | eval return |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lib, seed, wall, mean, std, roll, pol, critic in rows:
        split = f"{pol:.1f} | {critic:.1f}" if critic is not None else f"{pol:.1f} (policy + critic) | -"
        speed = f"{args.steps / wall:,.0f}"
        lines.append(f"| {lib} | {seed} | {wall:.1f} | {speed} | {roll:.1f} | {split} | {mean:.1f} ± {std:.1f} |")
    libs = ("minirl", "sb3-contrib")
    med = {lib: statistics.median(r[2] for r in rows if r[0] == lib) for lib in libs}
    evals = {lib: statistics.median(r[3] for r in rows if r[0] == lib) for lib in libs}
    roll = {lib: statistics.median(r[5] for r in rows if r[0] == lib) for lib in libs}
    lines += [
        "",
        f"Median wall time: minirl {med['minirl']:.1f} s, sb3-contrib {med['sb3-contrib']:.1f} s; "
        f"ratio minirl / sb3-contrib = **{med['minirl'] / med['sb3-contrib']:.2f}x** (target 0.5x). "
        f"Median evaluation return: minirl {evals['minirl']:.1f}, sb3-contrib {evals['sb3-contrib']:.1f}. "
        f"Median rollout time: minirl {roll['minirl']:.1f} s, sb3-contrib {roll['sb3-contrib']:.1f} s.",
        "sb3-contrib's rollout time is measured by a callback between rollout start and end; the rest is its update.",
        "Same math, different in details that are not hyperparameters: sb3-contrib's line search tests KL(new || old) "
        "< delta, minirl's KL(old || new) <= delta; sb3-contrib starts CG from 1e-4 noise, minirl from 0; "
        "sb3-contrib's critic loss is the MSE, minirl's half of it (Adam makes the two nearly the same).",
        "",
        f"{floor[2]} minirl's median is {med['minirl'] / floor[1]:.1f}x the kernel floor, sb3-contrib's "
        f"{med['sb3-contrib'] / floor[1]:.1f}x.",
    ]
    if profile:
        title = "Where minirl's time goes (cProfile, one run, seed 0, cumulative time; profiling adds overhead):"
        lines += ["", title, "", "```", profile.strip(), "```"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trpo_cartpole.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
