"""Reads benchmark runs' TensorBoard events, reduces them the standard way and writes the report.

    python benchmarks/report.py                       # runs/*__bench__* -> runs/reports/latest/README.md + PNGs
    python benchmarks/report.py --exp-names bench default --out-dir benchmarks/results   # the curated folder, named

Per run: the mean of its last 100 training episodes (`charts/episodic_return`, one point per episode).
Per (script, task, budget): mean ± std (population std, as CleanRL reports) over seeds, beside the published
references of docs/design.md §8. Learning curves: the mean over seeds of each run's trailing 100-episode mean,
with a band of ± one std, against steps and against wall time. No training happens here.
"""

from __future__ import annotations

import bisect
import glob
import importlib
import json
import multiprocessing
import os
import threading
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

# Published numbers (docs/design.md §8): task -> list of (source, steps, mean, std or None)
REFERENCES = {
    "HalfCheetah-v5": [("CleanRL ppo_continuous_action, HalfCheetah-v4, 3 seeds", 1_000_000, 1442.6, 46.0),
                       ("SB3 zoo PPO (tuned), HalfCheetah-v3, 1 run", 1_000_000, 5819.1, None)],
    "Hopper-v5": [("CleanRL, Hopper-v4, 3 seeds", 1_000_000, 2382.9, 271.7)],
    "Walker2d-v5": [("CleanRL, Walker2d-v4, 3 seeds", 1_000_000, 2288.0, 571.8)],
    "InvertedPendulum-v5": [("CleanRL, InvertedPendulum-v4, 3 seeds", 1_000_000, 963.1, 22.2)],
    "Humanoid-v5": [("CleanRL, Humanoid-v4, 3 seeds", 1_000_000, 716.1, 49.1)],
    "Pendulum-v1": [("CleanRL, 3 seeds", 8_000_000, -1142.0, 135.6),
                    ("SB3 zoo PPO (tuned, gSDE), 1 run", 100_000, -172.2, None)],
    "BipedalWalker-v3": [("SB3 zoo PPO, 1 run", 5_000_000, 287.9, None)],
    "PendulumNoVel-v1": [("SB3 zoo RecurrentPPO (tuned, gSDE), 1 run", 100_000, -217.9, None)],
}


# Sections written by the other benchmark commands, copied into the report when their files exist.
EXTRA_SECTIONS = [
    ("FrankaReach-v0: success rate against steps and wall time", "franka_reach_success.md",
     "python ppo_continuous.py --exp-name default\n"
     "python benchmarks/eval_curve.py --run-dir runs/FrankaReach-v0__default__1__<time>"),
    ("FrankaReachNoVel-v0 (velocities hidden) with ppo_recurrent.py", "franka_reach_success_recurrent.md",
     "python ppo_recurrent.py --exp-name default\n"
     "python benchmarks/eval_curve.py --run-dir runs/FrankaReachNoVel-v0__default__1__<time>"),
    ("FrankaReach-v0 with ppo_transformer.py (token mode)", "franka_reach_success_transformer.md",
     "python ppo_transformer.py --exp-name default_transformer\n"
     "python benchmarks/eval_curve.py --run-dir runs/FrankaReach-v0__default_transformer__1__<time>"),
    ("Training throughput relative to the raw environment", "train_throughput.md",
     "python benchmarks/train_throughput.py --env-id HalfCheetah-v5 --num-envs 1 "
     "--out benchmarks/results/train_throughput.md\n"
     "python benchmarks/train_throughput.py --env-id FrankaReach-v0 --num-envs 256 "
     "--out benchmarks/results/train_throughput.md\n"
     "python benchmarks/train_throughput.py --env-id FrankaReachNoVel-v0 --num-envs 1024 "
     "--scripts ppo_continuous ppo_recurrent --out benchmarks/results/train_throughput.md\n"
     "python benchmarks/train_throughput.py --env-id FrankaReach-v0 --num-envs 1024 "
     "--scripts ppo_continuous ppo_transformer --out benchmarks/results/train_throughput.md"),
    ("Raw FrankaReach-v0 throughput", "franka_env_throughput.md",
     "python benchmarks/env_throughput.py --env-id FrankaReach-v0 --out benchmarks/results/franka_env_throughput.md"),
]


@dataclass
class Args:
    runs_dir: str = "runs"
    """where the runs are"""
    exp_names: tuple[str, ...] = ("bench",)
    """reduce the runs whose experiment name is one of these"""
    out_dir: str = "runs/reports/latest"
    """where README.md and the PNGs go (benchmarks/results, the curated report, only when named)"""
    last: int = 100
    """episodes averaged at the end of each run"""


@dataclass
class Run:
    path: str
    exp_name: str
    script: str
    env_id: str
    seed: int
    total_timesteps: int
    planned_steps: int  # whole iterations: total_timesteps rounded down to a multiple of the batch
    last_step: int  # the global step the run reached (less than total_timesteps if it did not finish)
    episodes: np.ndarray  # (n, 3): global step, seconds since the start, raw return
    success: np.ndarray  # (m, 3): global step, seconds since the start, training success rate


def script_of(saved_args: dict) -> str:
    """Which script wrote a run, told by the flags only it has."""
    if "rnn_type" in saved_args:
        return "ppo_recurrent.py"
    return "ppo_transformer.py" if "context_len" in saved_args else "ppo_continuous.py"


def in_child(function, *args, **kwargs):
    """function(*args, **kwargs) in a fresh child process ("spawn": nothing of this process's torch threads or
    Genesis carries over), its result or exception returned or raised here. Genesis keeps part of the memory of every
    scene it destroys (genesis-world#949: ~45 MiB for a FrankaReach-v0 scene of 64 envs, more with more envs), so one
    process evaluating checkpoints one after another grows until it is killed (eval_curve.py: 24 GB after 32
    FrankaStackCube-v0 checkpoints of 1024 envs); a child gives it all back as it exits, for a Python start and
    Genesis's init (seconds: the kernels come from the cache). `function` is a module-level one (pickled by name)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             initializer=exit_with_parent, initargs=(os.getpid(),)) as child:
        return child.submit(function, *args, **kwargs).result()


def exit_with_parent(parent: int) -> None:
    """Run first in each child: ends it within a second of its parent's end. A parent killed by a signal runs no
    cleanup, and its child would run on, then wait for more work forever, holding its memory."""

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


class Script:
    """A training script, imported, whose evaluate() runs each time in a child process of its own (`in_child`);
    the rest (EVAL_NAMES, ...) is the module's own."""

    def __init__(self, name: str):
        self.name = name
        self.module = importlib.import_module(name)

    def __getattr__(self, attribute: str):
        return getattr(self.module, attribute)

    def evaluate(self, checkpoint_path: str, **kwargs) -> dict:
        return in_child(evaluate_with_script, self.name, checkpoint_path, **kwargs)


def evaluate_with_script(script: str, checkpoint_path: str, **kwargs) -> dict:
    """The named script's evaluate() (what a `Script`'s child runs)."""
    return importlib.import_module(script).evaluate(checkpoint_path, **kwargs)


def training_clock(run_dir: str):
    """The seconds a run had trained at each wall-clock time of its events. A resumed run writes a new events file
    and continues from its checkpoint: the time it was stopped, and the iterations after the checkpoint that it
    redoes, do not count. Files whose times overlap are one session (one process may write several)."""
    sessions = []  # [start, end, [(step, wall time), ...]]
    for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        events = EventAccumulator(path, size_guidance={"scalars": 0})
        events.Reload()
        tags = events.Tags()["scalars"]
        logged = [(e.step, e.wall_time) for tag in tags for e in events.Scalars(tag)]
        if not logged:
            continue
        start = min(wall for _, wall in logged)
        if "charts/SPS" in tags and "time/rollout_s" in tags:  # written at the end of the first iteration
            first_iteration = events.Scalars("time/rollout_s")[0].value + events.Scalars("time/update_s")[0].value
            start = events.Scalars("charts/SPS")[0].wall_time - first_iteration
        sessions.append([start, max(wall for _, wall in logged), logged])
    merged = []
    for session in sorted(sessions):
        if merged and session[0] < merged[-1][1]:
            merged[-1] = [merged[-1][0], max(merged[-1][1], session[1]), merged[-1][2] + session[2]]
        else:
            merged.append(session)
    starts, offsets = [], []
    for i, (start, _, logged) in enumerate(merged):
        offset = 0.0
        if i:  # the last session trained up to what it logged before the steps this one logs again
            before, previous_start = merged[i - 1][2], starts[-1]
            resumed_at = min(step for step, _ in logged)
            kept = [wall for step, wall in before if step < resumed_at] or [previous_start]
            offset = offsets[-1] + max(kept) - previous_start
        starts.append(start)
        offsets.append(offset)

    def seconds(wall_time: float) -> float:
        i = max(0, bisect.bisect_right(starts, wall_time) - 1)
        return offsets[i] + wall_time - starts[i] if starts else 0.0

    return seconds


def read_run(path: str) -> Run:
    """One run directory: its args.json and its event files (TensorBoard's own reader)."""
    with open(os.path.join(path, "args.json")) as f:
        args = json.load(f)
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]

    def series(tag):
        return [(e.step, e.wall_time, e.value) for e in events.Scalars(tag)] if tag in tags else []

    episodes, success = series("charts/episodic_return"), series("charts/success_rate")
    last_step = max((step for step, _, _ in series("charts/SPS")), default=0)
    clock = training_clock(path)

    def array(rows):
        return np.array([(s, clock(w), v) for s, w, v in rows], dtype=np.float64).reshape(-1, 3)

    script = script_of(args)
    total = int(args["total_timesteps"])
    # The steps the run was set to make: whole iterations of num_envs * num_steps (<= total_timesteps).
    planned = int(args.get("num_iterations", 0)) * int(args.get("batch_size", 0)) or total
    exp_name = os.path.basename(os.path.normpath(path)).split("__")[1]
    return Run(path, exp_name, script, args["env_id"], int(args["seed"]), total, planned, last_step or planned,
               array(episodes), array(success))


def final_return(run: Run, last: int = 100) -> float:
    """Mean raw return of the run's last `last` training episodes."""
    if len(run.episodes) == 0:
        return float("nan")
    return float(run.episodes[-last:, 2].mean())


def mean_std(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std())


def trailing_curve(run: Run, grid: np.ndarray, column: int, last: int = 100) -> np.ndarray:
    """The run's trailing mean of its last `last` episodes at each grid point (steps: column 0, time: 1)."""
    x, returns = run.episodes[:, column], run.episodes[:, 2]
    out = np.full(len(grid), np.nan)
    for i, g in enumerate(grid):
        upto = np.searchsorted(x, g, side="right")
        if upto > 0:
            out[i] = returns[max(0, upto - last) : upto].mean()
    return out


def group_runs(runs: list[Run]) -> dict[tuple[str, str, int, str], list[Run]]:
    """(script, task, budget, experiment name) -> its runs (the seeds)."""
    groups = defaultdict(list)
    for run in runs:
        groups[(run.script, run.env_id, run.total_timesteps, run.exp_name)].append(run)
    return dict(sorted(groups.items()))


def plot_group(key, runs: list[Run], out_dir: str, last: int) -> str | None:
    script, env_id, budget, exp_name = key
    runs = [run for run in runs if len(run.episodes)]
    if not runs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, column, scale, label in ((axes[0], 0, 1e6, "environment steps (millions)"),
                                     (axes[1], 1, 60.0, "wall time (minutes)")):
        end = max(run.episodes[-1, column] for run in runs)
        grid = np.linspace(0, end, 100)
        curves = np.array([trailing_curve(run, grid, column, last) for run in runs])
        seen = ~np.isnan(curves).all(axis=0)  # points before every run's first episode stay blank (no empty means)
        mean, std = np.full(len(grid), np.nan), np.full(len(grid), np.nan)
        mean[seen], std[seen] = np.nanmean(curves[:, seen], axis=0), np.nanstd(curves[:, seen], axis=0)
        ax.plot(grid / scale, mean, label=f"{script} ({len(runs)} seeds)")
        ax.fill_between(grid / scale, mean - std, mean + std, alpha=0.25)
        if column == 0:
            for source, steps, value, _ in REFERENCES.get(env_id, []):
                ax.axhline(value, linestyle="--", linewidth=1, color="grey")
                # at the axes' left edge, wherever the data's x range starts (x=0 in data stood outside the axes
                # of a short run and squeezed the figure's layout)
                ax.text(0, value, f" {source} at {steps / 1e6:g}M", fontsize=7, va="bottom", color="grey",
                        transform=ax.get_yaxis_transform())
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"return (trailing mean of {last} training episodes)")
    axes[0].legend(loc="lower right")
    fig.suptitle(f"{env_id}, {budget:,} steps, experiment {exp_name}: mean ± std over seeds")
    fig.tight_layout()
    name = f"{env_id}__{script.replace('.py', '')}__{budget}__{exp_name}.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return name


def write_report(args: Args) -> str:
    paths = sorted(p for name in args.exp_names for p in glob.glob(os.path.join(args.runs_dir, f"*__{name}__*"))
                   if os.path.isdir(p))
    runs = [read_run(p) for p in paths if os.path.isfile(os.path.join(p, "args.json"))]
    os.makedirs(args.out_dir, exist_ok=True)
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `python benchmarks/report.py --exp-names {' '.join(args.exp_names)}` "
        f"from the runs in `{args.runs_dir}/`.",
        f"Each run: mean of its last {args.last} training episodes (raw returns, with exploration noise).",
        "Each row: mean ± std (population) over seeds. References are published numbers (docs/design.md §8), "
        "cited as such.",
        "",
        "Seeds: runs that used the whole budget; a run that stopped short is listed with the steps it reached,",
        "and left out of the mean.",
        "",
        "| script | experiment | task | steps | seeds | ours: mean ± std | per seed | published reference |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    plots = []
    for key, group in group_runs(runs).items():
        script, env_id, budget, exp_name = key
        ordered = sorted(group, key=lambda r: r.seed)
        complete = [r for r in ordered if r.last_step >= r.planned_steps]
        mean, std = mean_std([final_return(r, args.last) for r in complete]) if complete else (float("nan"),) * 2
        refs = "; ".join(f"{src} at {steps / 1e6:g}M: {value:g}" + (f" ± {sd:g}" if sd is not None else "")
                         for src, steps, value, sd in REFERENCES.get(env_id, [])) or "-"
        per_seed = ", ".join(
            f"{final_return(r, args.last):.1f}" if r in complete
            else f"[seed {r.seed} stopped at {r.last_step:,}: {final_return(r, args.last):.1f}, not in the mean]"
            for r in ordered
        )
        lines.append(f"| {script} | {exp_name} | {env_id} | {budget:,} | {len(complete)} "
                     f"| **{mean:.1f} ± {std:.1f}** | {per_seed} | {refs} |")
        plots.append(plot_group(key, group, args.out_dir, args.last))
    lines += ["", "## Learning curves", ""] + [f"![{p}]({p})" for p in plots if p]
    for title, name, command in EXTRA_SECTIONS:
        path = os.path.join(args.out_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                lines += ["", f"## {title}", "", f"```bash\n{command}\n```", "", f.read().strip()]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out_dir, "README.md"), "w") as f:
        f.write(text)
    print(text)
    return text


if __name__ == "__main__":
    write_report(tyro.cli(Args))
