"""Training throughput as a ratio to raw environment throughput, both measured in this one process.

    python benchmarks/train_throughput.py --env-id HalfCheetah-v5 --num-envs 1
    python benchmarks/train_throughput.py --env-id FrankaReach-v0 --num-envs 64 256 1024

Raw: env-steps/s with uniformly random actions (same env, same num_envs). Training: ppo_continuous.py with
its preset for the task (num_envs overridden), the median SPS over iterations after the first (which warms
up). The ratio is the figure to compare across machines; absolute numbers drift on shared machines.
Measure on an otherwise idle machine: other processes competing for the cores distort the ratio badly.
(ppo_recurrent.py and ppo_transformer.py join this table, relative to the MLP script, when they land.)
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_continuous  # noqa: E402
from benchmarks.env_throughput import env_steps_per_second  # noqa: E402


@dataclass
class Args:
    env_id: str = "HalfCheetah-v5"
    """the task"""
    num_envs: list[int] = field(default_factory=lambda: [1])
    """parallel envs, for both measurements; one row per value"""
    iterations: int = 6
    """training iterations (the first is dropped as warm-up)"""
    raw_steps: int = 2000
    """timed random-action steps per env for the raw measurement"""
    out: str | None = None
    """append the result row to this Markdown file"""


def measure(env_id: str, num_envs: int, iterations: int, raw_steps: int) -> dict:
    raw_sps = env_steps_per_second(env_id, num_envs, max(raw_steps // num_envs, 50), warmup=10)
    batch_size = ppo_continuous.resolve_args(ppo_continuous.Args(env_id=env_id, num_envs=num_envs)).batch_size
    train_args = ppo_continuous.Args(
        env_id=env_id, num_envs=num_envs, progress_bar=False, exp_name="throughput",
        total_timesteps=iterations * batch_size, checkpoint_interval=10**9,
    )
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            history = ppo_continuous.train(train_args)["history"]
        finally:
            os.chdir(cwd)
    train_sps = float(np.median([h["charts/SPS"] for h in history[1:]]))
    rollout_fraction = float(np.median([h["time/rollout_fraction"] for h in history[1:]]))
    return {"raw_sps": raw_sps, "train_sps": train_sps, "ratio": train_sps / raw_sps, "rollout_fraction": rollout_fraction}


def main(args: Args) -> list[dict]:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    print("| script | env | num_envs | raw env SPS | training SPS | ratio | rollout share | machine |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    results = []
    for num_envs in args.num_envs:
        r = measure(args.env_id, num_envs, args.iterations, args.raw_steps)
        row = (f"| ppo_continuous.py | {args.env_id} | {num_envs} | {r['raw_sps']:,.0f} | {r['train_sps']:,.0f} | "
               f"**{r['ratio']:.2f}** | {r['rollout_fraction']:.2f} | {machine} |")
        print(row, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(row + "\n")
        results.append(r)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
