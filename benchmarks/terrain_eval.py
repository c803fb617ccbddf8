"""Rough-terrain runs side by side: how far up the terrain curriculum each climbed, and how each policy fares on
each terrain type, level by level.

    python ppo_recurrent.py --env-id Go2Rough-v0 --privileged-critic --update-threads 1 --exp-name rough \\
        --total-timesteps 25000000
    python ppo_recurrent.py --env-id Go2RoughBlind-v0 --privileged-critic --update-threads 1 --exp-name rough \\
        --total-timesteps 25000000
    python benchmarks/terrain_eval.py --run-dirs runs/Go2Rough-v0__rough__1__<time> \\
        runs/Go2RoughBlind-v0__rough__1__<time> --stem go2rough_scan_vs_blind --video-type stairs_up

From each run's training events (TensorBoard's reader): the mean terrain level of the episodes that ended in each
iteration against steps (the curriculum's progress), and over the last `--last-iterations` iterations the level
reached and the fall rate per terrain type. From each run's last periodic checkpoint, the script's own evaluate()
(mean action, frozen normaliser, fresh episodes) with the curriculum off and every robot on one level
(`start_level`), for each of `--levels`: the fall rate and the velocity tracking error per terrain type,
`--episodes-per-type` episodes each. Writes <stem>.md and <stem>.png; evaluations are cached in the run directories
(terrain_eval_<episodes>.json). `--video-type`: also an evaluation video of one robot on that terrain type at
`--video-level`, on a field of that type alone, saved as videos/<type>_level<L>.mp4 in the run directory (a strip of
it: benchmarks/frames.py).
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
import torch  # noqa: E402
import tyro  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.eval_bins import evaluate_with_env_kwargs  # noqa: E402
from benchmarks.eval_compare import script_module, wall_minutes  # noqa: E402
from benchmarks.report import script_of  # noqa: E402
from envs.terrain import TERRAIN_TYPES  # noqa: E402

LEVEL_TAG = "episode_metrics/terrain_level"


@dataclass
class Args:
    run_dirs: tuple[str, ...]
    """run directories of training runs on Go2Rough-v0 / Go2RoughBlind-v0 (with periodic checkpoints)"""
    levels: tuple[int, ...] = (0, 3, 6, 9)
    """terrain levels to evaluate each run's last checkpoint on (0 easiest; the default field has 10)"""
    episodes_per_type: int = 20
    """evaluation episodes per terrain type and level"""
    last_iterations: int = 20
    """training iterations at the end over which the level and falls per terrain type are averaged"""
    video_type: str | None = None
    """a terrain type to record one evaluation episode on (None: no video)"""
    video_level: int = 6
    """the level of that video"""
    out_dir: str = "benchmarks/results/go2"
    """where the PNG and the Markdown table go"""
    stem: str = "terrain_eval"
    """file name of the PNG and the table"""


def training_curves(run_dir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{tag: (steps, values)} of the run's terrain metrics as logged per iteration (NaN-free: an iteration in which
    no episode of a type ended logs nothing for it)."""
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith((LEVEL_TAG, "episode_metrics/fell"))]
    curves = {}
    for tag in tags:
        scalars = events.Scalars(tag)
        curves[tag] = (np.array([s.step for s in scalars]), np.array([s.value for s in scalars]))
    return curves


def tail_mean(curve: tuple[np.ndarray, np.ndarray] | None, last: int) -> float:
    if curve is None or len(curve[1]) == 0:
        return float("nan")
    return float(np.mean(curve[1][-last:]))


def last_checkpoint(run_dir: str) -> tuple[str, dict]:
    """The path and contents of the run's last periodic checkpoint."""
    path = sorted(glob.glob(os.path.join(run_dir, "checkpoint_[0-9]*.pt")))[-1]
    return path, torch.load(path, map_location="cpu", weights_only=True)


def evaluate_levels(run_dir: str, module, levels: tuple[int, ...], episodes_per_type: int) -> dict[str, dict]:
    """{level: the script's evaluate() of the run's last periodic checkpoint on that level alone}, cached."""
    checkpoint_path, checkpoint = last_checkpoint(run_dir)
    types = (checkpoint["args"].get("env_kwargs") or {}).get("terrain_types", TERRAIN_TYPES)
    episodes = episodes_per_type * len(types)  # env i plays type i mod types: as many episodes of each
    cache_path = os.path.join(run_dir, f"terrain_eval_{episodes}.json")
    cache = {}
    if os.path.exists(cache_path):
        with open(cache_path) as f:
            cache = json.load(f)
    results = cache.setdefault(os.path.basename(checkpoint_path), {})
    for level in levels:
        if str(level) in results:
            continue
        results[str(level)] = evaluate_with_env_kwargs(module, checkpoint_path, checkpoint["global_step"],
                                                       dict(curriculum=False, start_level=level), episodes)
        with open(cache_path + ".tmp", "w") as f:
            json.dump(cache, f)
        os.replace(cache_path + ".tmp", cache_path)
    return {int(level): result for level, result in results.items() if int(level) in levels}


def record_video(run_dir: str, module, terrain_type: str, level: int) -> str:
    """One evaluation episode of the run's last periodic checkpoint on a field of `terrain_type` alone at `level`
    (env 0 is the recorded one, and env i plays type i mod types); returns the video's path."""
    checkpoint_path, checkpoint = last_checkpoint(run_dir)
    env_kwargs = dict(terrain_types=[terrain_type], curriculum=False, start_level=level)
    evaluate_with_env_kwargs(module, checkpoint_path, checkpoint["global_step"], env_kwargs, episodes=1,
                             capture_video=True)
    path = os.path.join(run_dir, "videos", f"{terrain_type}_level{level}.mp4")
    os.replace(os.path.join(run_dir, "videos", "eval.mp4"), path)
    return path


def run_label(saved_args: dict) -> str:
    return f"{saved_args['env_id']} ({script_of(saved_args)}, {saved_args['exp_name']}, seed {saved_args['seed']})"


def main(args: Args) -> str:
    if args.video_type is not None and args.video_type not in TERRAIN_TYPES:
        raise SystemExit(f"error: --video-type {args.video_type} is not a terrain type; choose one of "
                         f"{', '.join(TERRAIN_TYPES)}")
    runs = []
    for run_dir in args.run_dirs:
        if not glob.glob(os.path.join(run_dir, "checkpoint_[0-9]*.pt")):
            raise SystemExit(f"error: --run-dirs {run_dir} has no periodic checkpoint (checkpoint_<iteration>.pt); "
                             "name the directory of a training run")
        with open(os.path.join(run_dir, "args.json")) as f:
            saved = json.load(f)
        module = script_module(saved)
        runs.append(dict(label=run_label(saved), curves=training_curves(run_dir), wall=wall_minutes(run_dir),
                         levels=evaluate_levels(run_dir, module, args.levels, args.episodes_per_type),
                         video=record_video(run_dir, module, args.video_type, args.video_level)
                         if args.video_type else None))
    types = [t for t in TERRAIN_TYPES if any(f"{LEVEL_TAG}/{t}" in r["curves"] for r in runs)]

    last = args.last_iterations
    lines = ["Training (episodes with exploration noise, the curriculum on): the mean level of the episodes that ended "
             f"in each of the last {last} iterations, averaged, overall and per terrain type; then the fall rate.", "",
             "| run | steps | wall time (min) | mean level | " + " | ".join(types) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(types)]
    for r in runs:
        steps = int(r["curves"][LEVEL_TAG][0][-1]) if LEVEL_TAG in r["curves"] else 0
        cells = [f"{tail_mean(r['curves'].get(f'{LEVEL_TAG}/{t}'), last):.2f}" for t in types]
        level = tail_mean(r["curves"].get(LEVEL_TAG), last)
        lines.append(f"| {r['label']} | {steps:,} | {r['wall']:.0f} | **{level:.2f}** | " + " | ".join(cells) + " |")
    lines += ["", "| run (falls) | all types | " + " | ".join(types) + " |", "|---|---:|" + "---:|" * len(types)]
    for r in runs:
        cells = [f"{100 * tail_mean(r['curves'].get(f'episode_metrics/fell/{t}'), last):.1f}%" for t in types]
        lines.append(f"| {r['label']} | {100 * tail_mean(r['curves'].get('episode_metrics/fell'), last):.1f}% | "
                     + " | ".join(cells) + " |")
    lines += ["", f"Evaluation of the last checkpoint (mean action, the curriculum off, every robot on one level, "
              f"{args.episodes_per_type} episodes per terrain type and level): fall rate per terrain type, and the "
              "linear-velocity tracking error over all types (m/s).", "",
              "| run | level | lin. error | falls, all | " + " | ".join(types) + " |",
              "|---|---:|---:|---:|" + "---:|" * len(types)]
    for r in runs:
        for level, result in sorted(r["levels"].items()):
            cells = [f"{100 * result[f'fell/{t}']:.0f}%" if f"fell/{t}" in result else "-" for t in types]
            lines.append(f"| {r['label']} | {level} | {result.get('lin_vel_error', float('nan')):.3f} | "
                         f"{100 * result.get('fell', float('nan')):.1f}% | " + " | ".join(cells) + " |")
    lines += [""] + [f"Video of {r['label']}: {r['video']}" for r in runs if r["video"]]
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{args.stem}.md"), "w") as f:
        f.write(text)

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
    for color, r in zip(colors, runs):
        if LEVEL_TAG in r["curves"]:
            steps, values = r["curves"][LEVEL_TAG]
            axes[0].plot(steps / 1e6, values, color=color, linewidth=1, label=r["label"])
    axes[0].set(xlabel="environment steps (millions)", ylabel="mean terrain level of ended episodes",
                title="the curriculum (training)")
    width = 0.8 / max(len(runs), 1)
    for k, (color, r) in enumerate(zip(colors, runs)):
        axes[1].bar(np.arange(len(types)) + k * width, [tail_mean(r["curves"].get(f"{LEVEL_TAG}/{t}"), last)
                                                        for t in types], width, color=color, label=r["label"])
    axes[1].set_xticks(np.arange(len(types)) + 0.4 - width / 2, types, rotation=30)
    axes[1].set(ylabel="mean terrain level", title=f"level per terrain type (last {last} iterations)")
    for color, r in zip(colors, runs):
        levels = sorted(r["levels"])
        axes[2].plot(levels, [100 * r["levels"][level]["fell"] for level in levels], "o-", color=color,
                     label=r["label"])
    axes[2].set(xlabel="terrain level (curriculum off)", ylabel="falls (% of episodes)",
                title="evaluation of the last checkpoint, all types")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, f"{args.stem}.png"), dpi=110)
    print(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
