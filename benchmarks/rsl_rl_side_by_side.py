"""rsl_rl's PPO and our `ppo_continuous.py` on FrankaReach-v0, side by side: evaluation success against env steps
and wall time, in one sitting.

    python benchmarks/rsl_rl_side_by_side.py --seeds 1 2 3 --out-dir benchmarks/results/rsl_rl_side_by_side

rsl_rl runs as published (the `rsl-rl-lib` wheel at a pinned version, installed once with pip into --lib-dir beside
this project's venv, so it shares our torch and Genesis), configured as Isaac Lab's Franka reach task
(`FrankaReachEnvCfg`'s rsl_rl runner: 64x64 ELU actor and critic, 24 steps per env, 8 epochs of 4 minibatches,
adaptive KL 0.01, entropy 0.001, initial std 1, no observation normalisation), on our FrankaReach-v0 through a
small adapter to its `VecEnv` interface (time-outs passed as `time_outs`, as Isaac Lab does). Ours runs its own
default command, or with --ours-args a variant of it (with --skip-rsl-rl, against an earlier sitting's rsl_rl rows):

    python benchmarks/rsl_rl_side_by_side.py --skip-rsl-rl --label scaled --ours-args=--norm-reward \
        --out-dir benchmarks/results/rsl_rl_side_by_side/scaled

Runs alternate per seed (rsl_rl, then ours), on an otherwise idle machine.

Both are evaluated the same way, by `ppo_continuous.evaluate()`: rsl_rl's actor (same layer shapes) is copied into
one of our checkpoints (without observation normalisation), then 1000 fresh episodes with the mean action on seed
+ 10000. Wall time counts training only, from the first iteration's start (scene builds and evaluations excluded).
"""

from __future__ import annotations

import glob
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RSL_RL_PACKAGES = ["rsl-rl-lib==5.5.1", "tensordict==0.15.3", "cloudpickle", "pyvers<0.3", "GitPython", "gitdb",
                   "smmap"]
NUM_ENVS, NUM_STEPS = 1024, 24
# Isaac Lab's FrankaReachPPORunnerCfg (isaaclab_tasks manipulation/reach/config/franka/agents/rsl_rl_ppo_cfg.py).
RSL_RL_CFG = {
    "num_steps_per_env": NUM_STEPS,
    "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
    "logger": "tensorboard",
    "algorithm": {
        "class_name": "PPO", "value_loss_coef": 1.0, "use_clipped_value_loss": True, "clip_param": 0.2,
        "entropy_coef": 0.001, "num_learning_epochs": 8, "num_mini_batches": 4, "learning_rate": 1.0e-3,
        "schedule": "adaptive", "gamma": 0.99, "lam": 0.95, "desired_kl": 0.01, "max_grad_norm": 1.0,
    },
    "actor": {"class_name": "MLPModel", "hidden_dims": [64, 64], "activation": "elu", "obs_normalization": False,
              "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0, "std_type": "scalar"}},
    "critic": {"class_name": "MLPModel", "hidden_dims": [64, 64], "activation": "elu", "obs_normalization": False},
}


@dataclass
class Args:
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    """seeds; for each, rsl_rl's run then ours"""
    total_timesteps: int = 6_000_000
    """environment steps per run"""
    eval_every: int = 20
    """iterations between evaluated checkpoints (20 x 1024 x 24 = 0.49M steps)"""
    episodes: int = 1000
    """evaluation episodes per checkpoint"""
    target: float = 0.95
    """the success rate whose first crossing is reported"""
    out_dir: str = "benchmarks/results/rsl_rl_side_by_side"
    """where the table, the plot and every evaluation (evaluations.json) go; the runs themselves go to runs/"""
    lib_dir: str = os.path.join(ROOT, "benchmarks", ".rsl-rl-lib")
    """where rsl-rl-lib and its few extra dependencies are installed (pip --target)"""
    skip_rsl_rl: bool = False
    """only our runs; rsl_rl's evaluations are read from --rsl-rl-results (no rsl_rl training or evaluation)"""
    rsl_rl_results: str = "benchmarks/results/rsl_rl_side_by_side/evaluations.json"
    """--skip-rsl-rl: an earlier sitting's evaluations.json whose rsl_rl rows are reused"""
    ours_args: str = ""
    """extra flags for ppo_continuous.py, one string (--ours-args="--no-norm-reward --vf-coef 2"): a variant"""
    label: str = ""
    """names the variant: its runs' --exp-name suffix and its rows in the table (needed with --ours-args)"""
    worker_seed: int = -1
    """(used by the benchmark itself) train rsl_rl with this seed in this process, nothing else"""
    worker_evaluate: str = ""
    """(used by the benchmark itself) evaluate this run directory's checkpoints in this process, nothing else"""


class RslRlEnv:
    """FrankaReach-v0 behind rsl_rl's VecEnv interface: observations as a TensorDict group "policy", dones =
    terminated | truncated, `time_outs` = truncated (rsl_rl bootstraps them)."""

    def __init__(self, vec):
        from tensordict import TensorDict

        self.vec, self.TensorDict = vec, TensorDict
        self.num_envs, self.num_actions = vec.num_envs, vec.single_action_space.shape[0]
        self.max_episode_length, self.device, self.cfg = vec.max_episode_steps, vec.device, {}
        self.obs, _ = vec.reset()

    def get_observations(self):
        return self.TensorDict({"policy": self.obs}, batch_size=[self.num_envs])

    def step(self, actions: torch.Tensor):
        self.obs, reward, terminated, truncated, info = self.vec.step(actions)
        terms = {f"/reward_terms/{k}": v.mean() for k, v in info["reward_terms"].items()}
        extras = {"time_outs": truncated, "log": terms}
        return self.get_observations(), reward, (terminated | truncated).long(), extras


def train_rsl_rl(seed: int, iterations: int, eval_every: int, run_dir: str) -> None:
    """rsl_rl's OnPolicyRunner for `iterations`; model_<it>.pt every `eval_every` iterations, with the wall time
    since the start of training of each in wall.json."""
    import envs
    from rsl_rl.runners import OnPolicyRunner

    torch.manual_seed(seed)
    vec = envs.make("FrankaReach-v0", num_envs=NUM_ENVS, seed=seed, device="cpu", sim_device="cpu")
    cfg = json.loads(json.dumps(RSL_RL_CFG))
    cfg.update(save_interval=eval_every, seed=seed)
    runner = OnPolicyRunner(RslRlEnv(vec), cfg, log_dir=run_dir, device="cpu")
    wall, save = {}, runner.save

    def timed_save(path, infos=None):  # the clock stops while a checkpoint is written
        wall[os.path.basename(path)] = time.perf_counter() - start
        save(path, infos)

    runner.save = timed_save
    start = time.perf_counter()
    runner.learn(num_learning_iterations=iterations)
    with open(os.path.join(run_dir, "wall.json"), "w") as f:
        json.dump(wall, f)
    vec.close()


def as_our_checkpoint(rsl_rl_path: str, seed: int, iteration: int, out_path: str) -> None:
    """rsl_rl's actor and critic (64x64 ELU, scalar std) as a checkpoint of ppo_continuous.py without observation
    normalisation, so that its evaluate() runs it: the same protocol for both."""
    import envs
    import ppo_continuous

    saved = torch.load(rsl_rl_path, map_location="cpu", weights_only=False)
    args = ppo_continuous.task_args("FrankaReach-v0", norm_obs=False, norm_reward=False, seed=seed)
    vec = envs.make("FrankaReach-v0", num_envs=1, seed=0, device="cpu", sim_device="cpu")
    agent, obs_norm, _ = ppo_continuous.build_agent(args, vec, torch.device("cpu"))
    vec.close()
    actor, critic = saved["actor_state_dict"], saved["critic_state_dict"]
    weights = {f"actor_mean.{k[len('mlp.'):]}": v for k, v in actor.items() if k.startswith("mlp.")}
    weights.update({f"critic.{k[len('mlp.'):]}": v for k, v in critic.items() if k.startswith("mlp.")})
    weights["actor_logstd"] = actor["distribution.std_param"].log().view(1, -1)
    agent.load_state_dict({**agent.state_dict(), **weights})
    torch.save({"script": ppo_continuous.CHECKPOINT_KIND, "args": asdict(args), "model": agent.state_dict(),
                "obs_normalizer": obs_norm.state_dict(), "global_step": iteration * NUM_ENVS * NUM_STEPS,
                "iteration": iteration}, out_path)


def evaluate_rsl_rl_model(rsl_rl_path: str, seed: int, iteration: int, episodes: int) -> dict:
    """One saved model of an rsl_rl run through our evaluate(), from a temporary converted copy beside it."""
    import ppo_continuous

    converted = os.path.join(os.path.dirname(rsl_rl_path), f"ours_{os.path.basename(rsl_rl_path)}")
    as_our_checkpoint(rsl_rl_path, seed, iteration, converted)
    try:
        return ppo_continuous.evaluate(converted, episodes=episodes, device="cpu", sim_device="cpu")
    finally:
        os.remove(converted)


def evaluate_rsl_rl(run_dir: str, seed: int, episodes: int) -> list[dict]:
    """Each saved model of an rsl_rl run through our evaluate(), each in a child process of its own (Genesis keeps
    memory of every scene it destroys), cached in the run directory."""
    from benchmarks.report import in_child

    with open(os.path.join(run_dir, "wall.json")) as f:
        wall = json.load(f)
    cache_path = os.path.join(run_dir, f"eval_{episodes}.json")
    cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}
    rows = []
    for name in sorted(wall, key=lambda n: int(n[len("model_"):-len(".pt")])):
        iteration = int(name[len("model_"):-len(".pt")]) + 1  # rsl_rl saves after iteration `it`, counted from 0
        if name not in cache:
            cache[name] = in_child(evaluate_rsl_rl_model, os.path.join(run_dir, name), seed, iteration, episodes)
            with open(cache_path, "w") as f:
                json.dump(cache, f)
        rows.append(dict(cache[name], step=iteration * NUM_ENVS * NUM_STEPS, wall=wall[name]))
    return rows


def evaluate_ours(run_dir: str, episodes: int) -> list[dict]:
    from benchmarks.eval_curve import evaluate_checkpoints, wall_seconds
    from benchmarks.report import Script

    wall = wall_seconds(run_dir)
    rows = evaluate_checkpoints(run_dir, Script("ppo_continuous"), episodes)
    return [dict(row, wall=wall[row["step"]]) for row in rows]


def summarise(rows: list[dict], target: float) -> dict:
    """First checkpoint at or above `target` (steps, seconds), the lowest success after it, and the last one."""
    first = next((i for i, row in enumerate(rows) if row["success_rate"] >= target), None)
    return {
        "steps": rows[first]["step"] if first is not None else math.nan,
        "seconds": rows[first]["wall"] if first is not None else math.nan,
        "min_after": min(row["success_rate"] for row in rows[first:]) if first is not None else math.nan,
        "final": rows[-1]["success_rate"],
        "seconds_per_iteration": rows[-1]["wall"] / (rows[-1]["step"] / (NUM_ENVS * NUM_STEPS)),
    }


def write_report(args: Args, results: dict[str, dict[int, list[dict]]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [
        "# rsl_rl and ppo_continuous.py on FrankaReach-v0, side by side", "",
        f"`python benchmarks/rsl_rl_side_by_side.py --seeds {' '.join(map(str, args.seeds))} --total-timesteps "
        f"{args.total_timesteps}"
        + (f" --skip-rsl-rl --label {args.label} --ours-args={shlex.quote(args.ours_args)} --out-dir {args.out_dir}"
           if args.label else "")
        + f"`, {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}. "
        f"Evaluation: {args.episodes} episodes, mean action, every {args.eval_every} iterations "
        f"({args.eval_every * NUM_ENVS * NUM_STEPS / 1e6:.2f}M steps); wall time = training only.", "",
        f"| library | seed | first >= {args.target:.0%} (steps) | (seconds) | lowest after | at the end | "
        "s / iteration |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for (name, runs), color in zip(results.items(), ("tab:blue", "tab:orange")):
        summaries = []
        for seed, rows in runs.items():
            s = summarise(rows, args.target)
            summaries.append(s)
            lines.append(f"| {name} | {seed} | {s['steps'] / 1e6:.2f}M | {s['seconds']:.0f} | {s['min_after']:.3f} | "
                         f"{s['final']:.3f} | {s['seconds_per_iteration']:.2f} |")
            for ax, key, scale in ((axes[0], "step", 1e6), (axes[1], "wall", 60)):
                ax.plot([r[key] / scale for r in rows], [r["success_rate"] for r in rows], "o-", color=color,
                        alpha=0.7, label=name if seed == args.seeds[0] else None)
        mean = {k: sum(s[k] for s in summaries) / len(summaries) for k in summaries[0]}
        lines.append(f"| **{name}** | mean | **{mean['steps'] / 1e6:.2f}M** | **{mean['seconds']:.0f}** | "
                     f"{min(s['min_after'] for s in summaries):.3f} (min) | {mean['final']:.3f} | "
                     f"{mean['seconds_per_iteration']:.2f} |")
    for ax, label in ((axes[0], "environment steps (millions)"), (axes[1], "wall time (minutes, training only)")):
        ax.axhline(args.target, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("evaluation success rate")
    axes[0].legend()
    ours = f"with {args.ours_args}" if args.ours_args else "its defaults"
    fig.suptitle(f"FrankaReach-v0: rsl_rl (Isaac Lab's reach settings) and ppo_continuous.py ({ours})")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "rsl_rl_side_by_side.png"), dpi=120)
    report = os.path.join(args.out_dir, "README.md")
    with open(report, "w") as f:
        f.write("\n".join(lines) + "\n")
    return report


def main(args: Args) -> None:
    os.makedirs(args.out_dir, exist_ok=True)
    iterations = args.total_timesteps // (NUM_ENVS * NUM_STEPS)
    if not args.skip_rsl_rl and not os.path.isdir(os.path.join(args.lib_dir, "rsl_rl")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", args.lib_dir,
                        *RSL_RL_PACKAGES], check=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([args.lib_dir, ROOT]))
    ours_name = f"ppo_continuous.py {args.label}".strip()
    results: dict[str, dict[int, list[dict]]] = {"rsl_rl": {}, ours_name: {}}
    if args.skip_rsl_rl:  # json keys are strings
        with open(os.path.join(ROOT, args.rsl_rl_results)) as f:
            stored = json.load(f)["rsl_rl"]
        results["rsl_rl"] = {seed: stored[str(seed)] for seed in args.seeds if str(seed) in stored}
    # Each run is evaluated in a process of its own: every evaluation builds a Genesis scene, and scenes built one
    # after the other in one process do not give all their memory back (50 of them took 24 GB here).
    evaluate = [sys.executable, __file__, "--episodes", str(args.episodes), "--worker-evaluate"]
    for seed in args.seeds:
        rsl_dir = os.path.join(ROOT, "runs", f"rsl_rl_FrankaReach-v0__{iterations}__{seed}")
        if not args.skip_rsl_rl and not os.path.exists(os.path.join(rsl_dir, "wall.json")):
            subprocess.run([sys.executable, __file__, "--worker-seed", str(seed), "--total-timesteps",
                            str(args.total_timesteps), "--eval-every", str(args.eval_every), "--out-dir", rsl_dir],
                           check=True, env=env, cwd=ROOT)
        if not args.skip_rsl_rl and os.path.exists(os.path.join(rsl_dir, "wall.json")):
            subprocess.run(evaluate + [rsl_dir], check=True, env=env, cwd=ROOT)
            results["rsl_rl"][seed] = evaluate_rsl_rl(rsl_dir, seed, args.episodes)
        exp_name = f"rsl_rl_sbs_{iterations}" + (f"_{args.label}" if args.label else "")
        ours = sorted(glob.glob(os.path.join(ROOT, "runs", f"FrankaReach-v0__{exp_name}__{seed}__*")))
        if not ours or not glob.glob(os.path.join(ours[-1], f"checkpoint_{iterations:06d}.pt")):
            subprocess.run([sys.executable, "ppo_continuous.py", "--seed", str(seed), "--exp-name", exp_name,
                            "--total-timesteps", str(args.total_timesteps), "--checkpoint-interval",
                            str(args.eval_every), "--no-progress-bar", *shlex.split(args.ours_args)],
                           check=True, cwd=ROOT)
            ours = sorted(glob.glob(os.path.join(ROOT, "runs", f"FrankaReach-v0__{exp_name}__{seed}__*")))
        subprocess.run(evaluate + [ours[-1]], check=True, env=env, cwd=ROOT)
        results[ours_name][seed] = evaluate_ours(ours[-1], args.episodes)
    with open(os.path.join(args.out_dir, "evaluations.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {write_report(args, {k: v for k, v in results.items() if v})}")


if __name__ == "__main__":
    cli_args = tyro.cli(Args)
    if cli_args.ours_args and not cli_args.label:
        sys.exit("--ours-args needs --label NAME: the variant's runs and rows must stay apart from the default's")
    if cli_args.worker_seed >= 0:
        os.makedirs(cli_args.out_dir, exist_ok=True)
        train_rsl_rl(cli_args.worker_seed, cli_args.total_timesteps // (NUM_ENVS * NUM_STEPS), cli_args.eval_every,
                     cli_args.out_dir)
    elif cli_args.worker_evaluate:  # fills the run's evaluation cache
        run_dir = cli_args.worker_evaluate
        if os.path.exists(os.path.join(run_dir, "wall.json")):
            evaluate_rsl_rl(run_dir, int(run_dir.rsplit("__", 1)[1]), cli_args.episodes)
        else:
            evaluate_ours(run_dir, cli_args.episodes)
    else:
        main(cli_args)
