"""Success rate of a FrankaReach run against wall time and steps, from its event file and checkpoints.

    python ppo_continuous.py --exp-name default                       # the default command, ~18 min on 2 cores
    python benchmarks/franka_curve.py --run-dir runs/FrankaReach-v0__default__1__<time>
    python benchmarks/franka_curve.py --run-dir runs/FrankaReachNoVel-v0__default__1__<time>   # ppo_recurrent.py

Training success (with exploration noise) comes from the TensorBoard events (TensorBoard's own reader).
Evaluation success (mean action, frozen normaliser, fresh targets, --episodes episodes) is measured here on
every periodic checkpoint. Writes a PNG and a Markdown table into --out-dir.
"""

from __future__ import annotations

import glob
import importlib
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
from benchmarks.report import script_of  # noqa: E402


@dataclass
class Args:
    run_dir: str
    """the run directory of a FrankaReach-v0 training run"""
    episodes: int = 1000
    """evaluation episodes per checkpoint"""
    out_dir: str = "benchmarks/results"
    """where the PNG and the Markdown table go"""
    script: str | None = None
    """the script that trained the run (None: recognised from its args.json)"""




def main(args: Args) -> str:
    with open(os.path.join(args.run_dir, "args.json")) as f:
        saved = json.load(f)
    script = args.script or script_of(saved).removesuffix(".py")
    module = importlib.import_module(script)
    stem = "franka_reach_success" + ("" if script == "ppo_continuous" else f"_{script.removeprefix('ppo_')}")
    events = EventAccumulator(args.run_dir, size_guidance={"scalars": 0})
    events.Reload()
    train = events.Scalars("charts/success_rate")
    # Wall time from the start of training: the first event is logged at the end of the first iteration.
    first_iteration = events.Scalars("time/rollout_s")[0].value + events.Scalars("time/update_s")[0].value
    start = events.Scalars("charts/SPS")[0].wall_time - first_iteration
    wall_of_step = {s.step: s.wall_time - start for s in train}

    rows = []
    for path in sorted(glob.glob(os.path.join(args.run_dir, "checkpoint_*.pt"))):
        step = torch.load(path, map_location="cpu", weights_only=True)["global_step"]
        result = module.evaluate(path, episodes=args.episodes, device="cpu", sim_device="cpu")
        iteration = int(re.search(r"checkpoint_(\d+)", path).group(1))
        rows.append((iteration, step, wall_of_step.get(step, float("nan")), result["success_rate"], result["mean_return"]))

    os.makedirs(args.out_dir, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x_train, x_eval, label in (
        (axes[0], [s.step / 1e6 for s in train], [r[1] / 1e6 for r in rows], "environment steps (millions)"),
        (axes[1], [wall_of_step[s.step] / 60 for s in train], [r[2] / 60 for r in rows], "wall time (minutes, 2 CPU cores)"),
    ):
        ax.plot(x_train, [s.value for s in train], label="training episodes (exploration noise)", alpha=0.7)
        ax.plot(x_eval, [r[3] for r in rows], "o-", label=f"evaluation ({args.episodes} episodes, mean action)")
        ax.axhline(0.95, color="grey", linestyle="--", linewidth=1, label="95% target")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate (within 2 cm at episode end)")
    axes[0].legend(loc="lower right")
    fig.suptitle(f"{script}.py on {saved['env_id']}, default command")
    fig.tight_layout()
    png = os.path.join(args.out_dir, f"{stem}.png")
    fig.savefig(png, dpi=120)

    table = ["| iteration | steps | wall time | eval success | eval mean return |", "|---:|---:|---:|---:|---:|"]
    table += [f"| {i} | {s:,} | {w / 60:.1f} min | {sr:.3f} | {ret:.1f} |" for i, s, w, sr, ret in rows]
    text = "\n".join(table) + "\n"
    with open(os.path.join(args.out_dir, f"{stem}.md"), "w") as f:
        f.write(f"Run: `{os.path.basename(os.path.normpath(args.run_dir))}`\n\n" + text)
    print(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
