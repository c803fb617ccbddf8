"""A run's evaluation metrics against environment steps and wall time, from its event file and checkpoints.

    python ppo_continuous.py --exp-name default                       # the default command, ~18 min on 2 cores
    python benchmarks/eval_curve.py --run-dir runs/FrankaReach-v0__default__1__<time>
    python benchmarks/eval_curve.py --run-dir runs/FrankaReachNoVel-v0__default__1__<time>   # ppo_recurrent.py
    python benchmarks/eval_curve.py --run-dir runs/Go2Walk-v0__go2__1__<time>

Every periodic checkpoint is evaluated here (the script's own --eval-checkpoint: mean action, frozen normaliser,
fresh episodes, --episodes of them); the training-time values (with exploration noise) come from the TensorBoard
events (TensorBoard's own reader). Plotted: the success rate for tasks that report one, else every metric of the
task's `info["episode_metrics"]` (Go2Walk-v0: tracking errors and falls); the cube tasks' success at any step too, and
the stacking task's stages.
A run evaluated while it trained (--eval-interval) has its logged eval/* values beside these, at the same steps
(equal where --eval-episodes was --episodes). Writes a PNG and a Markdown table; the results are kept in the run
directory (eval_curve_<episodes>.json), so a rerun evaluates only new checkpoints. Each checkpoint is evaluated in a
child process of its own (benchmarks/report.py's Script: Genesis keeps memory of every scene it destroys).
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import tyro  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.report import Script, script_of, training_clock  # noqa: E402

# What evaluate() reports besides the task's metrics.
GENERAL = ("episodes", "mean_return", "std_return", "mean_length", "video")
# Metric -> (axis label, target line or None, training tag).
LABELS = {
    "success_rate": ("success rate", None, "charts/success_rate"),  # its target: --success-target
    "success_once": ("success at any step", None, "episode_metrics/success_once"),
    # FrankaStackCube-v0's stages (envs.franka_cube.STACK_STAGES): how far the episodes got
    "stage": ("highest stage reached\n(1 grasped, 2 A on B, 3 solved)", None, "episode_metrics/stage"),
    "reached_grasped": ("episodes that grasped A", None, "episode_metrics/reached_grasped"),
    "reached_stacked": ("episodes that put A on B", None, "episode_metrics/reached_stacked"),
    "closest_to_b": ("A's nearest approach to\nthe top of B (m)", None, "episode_metrics/closest_to_b"),
    "lift": ("how high A rose above\nits resting height (m)", None, "episode_metrics/lift"),
    "released_on_b": ("episodes that opened\nthe gripper with A on B", None, "episode_metrics/released_on_b"),
    "fell": ("fall rate", 0.05, "episode_metrics/fell"),
    "lin_vel_error": ("linear-velocity tracking error (m/s)", 0.1, "episode_metrics/lin_vel_error"),
    "ang_vel_error": ("yaw-rate tracking error (rad/s)", None, "episode_metrics/ang_vel_error"),
}


@dataclass
class Args:
    run_dir: str
    """the run directory of a training run with periodic checkpoints"""
    episodes: int = 1000
    """evaluation episodes per checkpoint"""
    out_dir: str = "benchmarks/results"
    """where the PNG and the Markdown table go"""
    script: str | None = None
    """the script that trained the run (None: recognised from its args.json)"""
    stem: str | None = None
    """file name of the PNG and the table (None: franka_reach_success[_script] for the arm, else env_script_eval)"""
    success_target: float | None = 0.95
    """the success rate drawn as the target line (FrankaReach-v0's 0.95; e.g. 0.8 for picking; None: no line)"""


def default_stem(env_id: str, script: str) -> str:
    suffix = "" if script == "ppo_continuous" else f"_{script.removeprefix('ppo_')}"
    if env_id in ("FrankaReach-v0", "FrankaReachNoVel-v0"):  # the names they have had since the first benchmarks
        return "franka_reach_success" + suffix
    return f"{env_id.split('-')[0].lower()}_{script.removeprefix('ppo_')}_eval"


def wall_seconds(run_dir: str) -> dict[int, float]:
    """Seconds of training from the start of a run to the end of each iteration (by its env step), from its events;
    a resumed run's stopped time left out (report.training_clock)."""
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    clock = training_clock(run_dir)
    return {s.step: clock(s.wall_time) for s in events.Scalars("charts/SPS")}


def evaluate_checkpoints(run_dir: str, module, episodes: int, last_only: bool = False) -> list[dict]:
    """The script's evaluate() of each periodic checkpoint of a run (or the last one), with "step" and "iteration".

    Results are kept beside the checkpoints (eval_curve_<episodes>.json), so a rerun (say, while training goes on)
    evaluates only new checkpoints."""
    cache_path = os.path.join(run_dir, f"eval_curve_{episodes}.json")
    cache = {}
    if os.path.exists(cache_path):
        with open(cache_path) as f:
            cache = json.load(f)
    rows = []
    paths = sorted(glob.glob(os.path.join(run_dir, "checkpoint_[0-9]*.pt")))
    for path in paths[-1:] if last_only else paths:
        if os.path.basename(path) not in cache:
            step = torch.load(path, map_location="cpu", weights_only=True)["global_step"]
            result = module.evaluate(path, episodes=episodes, device="cpu", sim_device="cpu")
            cache[os.path.basename(path)] = dict(result, step=step)
            with open(cache_path + ".tmp", "w") as f:
                json.dump(cache, f)
            os.replace(cache_path + ".tmp", cache_path)
        iteration = int(re.search(r"checkpoint_(\d+)", path).group(1))
        rows.append(dict(cache[os.path.basename(path)], iteration=iteration))
    return rows


def main(args: Args) -> str:
    with open(os.path.join(args.run_dir, "args.json")) as f:
        saved = json.load(f)
    script = args.script or script_of(saved).removesuffix(".py")
    module = Script(script)  # each evaluation in a child: Genesis keeps memory of every scene it destroys
    stem = args.stem or default_stem(saved["env_id"], script)
    events = EventAccumulator(args.run_dir, size_guidance={"scalars": 0})
    events.Reload()
    wall_of_step = wall_seconds(args.run_dir)

    rows = [dict(result, wall=wall_of_step.get(result["step"], float("nan")))
            for result in evaluate_checkpoints(args.run_dir, module, args.episodes)]
    tags = events.Tags()["scalars"]
    eval_tag = {metric: module.EVAL_NAMES.get(metric, f"eval/{metric}") for metric in rows[0]}  # as the script logs
    logged = {metric: {s.step: s.value for s in events.Scalars(tag)}
              for metric, tag in eval_tag.items() if tag in tags}  # --eval-interval's logs
    if "success_rate" in rows[0]:  # the cube tasks also report success at any step of an episode (and stacking, stages)
        metrics = [k for k in ("success_rate", "success_once", "stage", "reached_grasped", "reached_stacked",
                               "closest_to_b", "lift", "released_on_b") if k in rows[0]]
    else:
        metrics = [k for k in rows[0] if k in LABELS]

    os.makedirs(args.out_dir, exist_ok=True)
    # Constrained layout keeps the title clear of the legend, which tight_layout let overlap on tall figures
    fig, axes = plt.subplots(len(metrics), 2, figsize=(11, 3.6 * len(metrics)), sharey="row", squeeze=False,
                             layout="constrained")
    for row_axes, metric in zip(axes, metrics):
        label, target, tag = LABELS.get(metric, (metric, None, f"episode_metrics/{metric}"))
        target = args.success_target if metric == "success_rate" else target
        train = events.Scalars(tag) if tag in events.Tags()["scalars"] else []
        for ax, x_train, x_eval, x_label in (
            (row_axes[0], [s.step / 1e6 for s in train], [r["step"] / 1e6 for r in rows],
             "environment steps (millions)"),
            (row_axes[1], [wall_of_step.get(s.step, float("nan")) / 60 for s in train], [r["wall"] / 60 for r in rows],
             "wall time (minutes, 2 CPU cores)"),
        ):
            ax.plot(x_train, [s.value for s in train], label="training episodes (exploration noise)", alpha=0.7)
            ax.plot(x_eval, [r[metric] for r in rows], "o-",
                    label=f"evaluation ({args.episodes} episodes, mean action)")
            if metric in logged:
                steps = sorted(logged[metric])
                x_logged = ([s / 1e6 for s in steps] if x_label.startswith("environment")
                            else [wall_of_step.get(s, float("nan")) / 60 for s in steps])
                ax.plot(x_logged, [logged[metric][s] for s in steps], "x",
                        label=f"evaluated while training (eval/, {saved.get('eval_episodes')} episodes)")
            if target is not None:
                ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target}")
            ax.set_xlabel(x_label)
            ax.grid(alpha=0.3)
        row_axes[0].set_ylabel(label)
    axes[0][0].legend(loc="best")
    fig.suptitle(f"{script}.py on {saved['env_id']}")
    fig.savefig(os.path.join(args.out_dir, f"{stem}.png"), dpi=120)

    columns = metrics + ["mean_length", "mean_return"]
    logged_columns = [c for c in columns if c in logged]
    table = ["| iteration | steps | wall time | " + " | ".join(f"eval {c}" for c in columns)
             + "".join(f" | logged {eval_tag[c]}" for c in logged_columns) + " |",
             "|---:|---:|---:|" + "---:|" * (len(columns) + len(logged_columns))]
    table += [f"| {r['iteration']} | {r['step']:,} | {r['wall'] / 60:.1f} min | "
              + " | ".join(f"{r[c]:.3f}" for c in columns)
              + "".join(f" | {logged[c][r['step']]:.3f}" if r["step"] in logged[c] else " | -" for c in logged_columns)
              + " |" for r in rows]
    text = "\n".join(table) + "\n"
    with open(os.path.join(args.out_dir, f"{stem}.md"), "w") as f:
        f.write(f"Run: `{os.path.basename(os.path.normpath(args.run_dir))}`\n\n" + text)
    print(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
