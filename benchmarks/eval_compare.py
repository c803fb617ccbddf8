"""Several experiments on one task side by side, by evaluation: each seed's checkpoints evaluated as
benchmarks/eval_curve.py does (the script's --eval-checkpoint: mean action, frozen normaliser, fresh episodes),
then mean ± std over seeds.

    python benchmarks/run.py --preset arm_memory --exp-name mem        # FrankaReachCue-v0, three scripts x 3 seeds
    python benchmarks/eval_compare.py --env-id FrankaReachCue-v0 \\
        --exp-names mem mem_recurrent mem_transformer mem_transformer_tokens --stem franka_reachcue_memory

    python benchmarks/eval_compare.py --env-id Go2WalkNoVelAll-v0 --exp-names novelall_recurrent novelall \\
        --episodes 200 --stem go2walknovelall_memory --out-dir benchmarks/results/go2

    python benchmarks/eval_compare.py --env-id FrankaReachCue-v0 --steps-in-all --stem franka_reachcue_memory_stages \
        --exp-names reachcue_memory_priv_from50_const reachcue_memory_priv_half_from50_const   # curricula (--init-from)

Writes <stem>.md (the last checkpoint of each run: success at the end and at any step, or the tracking errors and
fall rate, where the task reports them, and return; per seed and mean ± std) and <stem>.png (those against
environment steps, each seed thin, the mean thick). Evaluations are cached in the run directories, so a rerun
only evaluates new checkpoints.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.eval_curve import evaluate_checkpoints, wall_seconds  # noqa: E402
from benchmarks.report import Script, script_of  # noqa: E402

# What the table and the plot show, where the task reports it (the arm's success; the quadruped's tracking and falls).
METRICS = {"success_rate": "success at the end", "success_once": "success at any step",
           "lin_vel_error": "lin. velocity error (m/s)", "ang_vel_error": "yaw-rate error (rad/s)",
           "fell": "fall rate", "mean_return": "return"}
PERCENT = ("success_rate", "success_once", "fell")


@dataclass
class Args:
    env_id: str
    """the task the runs trained on"""
    exp_names: tuple[str, ...]
    """experiments to compare (run directories runs/<env-id>__<exp-name>__<seed>__<time>)"""
    episodes: int = 1000
    """evaluation episodes per checkpoint"""
    last_only: bool = False
    """evaluate each run's last checkpoint only (the plot then has one point per run)"""
    runs_dir: str = "runs"
    """where the run directories are"""
    out_dir: str = "benchmarks/results/franka_cube"
    """where the PNG and the Markdown table go"""
    stem: str = "eval_compare"
    """file name of the PNG and the table"""
    steps_in_all: bool = False
    """count a warm-started run's steps from its curriculum's start: the steps that trained the network it started
    from (--init-from), that run's own warm starts' included, are added (a stage's checkpoints at 5M in all, not 3M)"""


def script_module(saved_args: dict):
    """The training script of a run, imported; its evaluate() evaluates a checkpoint in a child process of its own."""
    return Script(script_of(saved_args).removesuffix(".py"))


def wall_minutes(run_dir: str) -> float:
    """Training wall time of a run to its last iteration (the time it was stopped before a resume left out)."""
    return max(wall_seconds(run_dir).values()) / 60


def steps_before(saved_args: dict, run_dir: str) -> int:
    """The steps that trained a run's network before the run began: 0 from scratch, else those its script recorded
    when it was warm-started (init_from_steps, which counts the source run's own warm starts)."""
    if saved_args.get("init_from") and "init_from_steps" not in saved_args:
        raise SystemExit(f"error: --steps-in-all: {run_dir} was warm-started (--init-from) by a script that did not "
                         "record the steps behind its network (init_from_steps in args.json); add them there, or "
                         "leave out --steps-in-all")
    return saved_args.get("init_from_steps", 0)


def fmt(value: float, metric: str) -> str:
    if metric in PERCENT:
        return f"{100 * value:.1f}%"
    return f"{value:.3f}" if metric.endswith("_error") else f"{value:.1f}"


def mean_std(values: list[float], metric: str = "") -> str:
    return f"{fmt(np.mean(values), metric)} ± {fmt(np.std(values), metric)}"


def main(args: Args) -> str:
    groups = {}
    for exp_name in args.exp_names:
        run_dirs = sorted(glob.glob(os.path.join(args.runs_dir, f"{args.env_id}__{exp_name}__*__*")))
        runs = []
        for run_dir in run_dirs:
            with open(os.path.join(run_dir, "args.json")) as f:
                saved = json.load(f)
            offset = steps_before(saved, run_dir) if args.steps_in_all else 0
            rows = [dict(row, step=row["step"] + offset)
                    for row in evaluate_checkpoints(run_dir, script_module(saved), args.episodes, args.last_only)]
            if rows:
                runs.append(dict(seed=saved["seed"], script=script_of(saved), rows=rows, wall=wall_minutes(run_dir)))
        if runs:
            groups[exp_name] = sorted(runs, key=lambda r: r["seed"])
    metrics = [m for m in METRICS if any(m in r["rows"][-1] for runs in groups.values() for r in runs)]

    lines = [f"{args.env_id}: the last checkpoint of each run, {args.episodes} evaluation episodes each (mean action).",
             "Mean ± std (population) over seeds; per seed in brackets, in seed order."
             + (" Steps in all: a warm-started run's include those that trained the network it started from."
                if args.steps_in_all else ""), "",
             "| experiment | script | seeds | steps | wall time (min) | "
             + " | ".join(f"eval {METRICS[m]}" for m in metrics) + " |",
             "|---|---|---:|---:|---:|" + "---|" * len(metrics)]
    for exp_name, runs in groups.items():
        finals = [r["rows"][-1] for r in runs]
        cells = [f"**{mean_std([f[m] for f in finals], m)}** ({', '.join(fmt(f[m], m) for f in finals)})"
                 for m in metrics]
        steps = sorted({f["step"] for f in finals})
        lines.append(f"| {exp_name} | {runs[0]['script']} | {len(runs)} | {', '.join(f'{s:,}' for s in steps)} | "
                     f"{mean_std([r['wall'] for r in runs])} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{args.stem}.md"), "w") as f:
        f.write(text)

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for color, (exp_name, runs) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], groups.items()):
            for r in runs:
                ax.plot([row["step"] / 1e6 for row in r["rows"]], [row[metric] for row in r["rows"]], "o-",
                        color=color, alpha=0.3, linewidth=1)
            # the mean over seeds at each checkpoint index (seeds of one experiment checkpoint at the same steps)
            n = min(len(r["rows"]) for r in runs)
            ax.plot([runs[0]["rows"][i]["step"] / 1e6 for i in range(n)],
                    [np.mean([r["rows"][i][metric] for r in runs]) for i in range(n)], "o-", color=color,
                    linewidth=2.5, label=f"{exp_name} ({runs[0]['script']}, seeds: {len(runs)})")
        ax.set_xlabel("environment steps in all, warm starts' included (millions)" if args.steps_in_all
                      else "environment steps (millions)")
        ax.set_ylabel(f"eval {METRICS[metric]}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="best", fontsize=8)
    fig.suptitle(f"{args.env_id}: evaluation ({args.episodes} episodes per checkpoint)")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, f"{args.stem}.png"), dpi=120)
    print(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
