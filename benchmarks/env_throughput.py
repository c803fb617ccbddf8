"""Raw environment throughput: env-steps/s with uniformly random actions, no policy.

    python benchmarks/env_throughput.py --env-id FrankaReach-v0 --num-envs 1 16 64 256 1024

Prints a Markdown table (and writes it to --out if given). Each batch size gets its own scene
in the same process, one warm-up of --warmup steps, then --steps timed steps.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import envs  # noqa: E402


@dataclass
class Args:
    env_id: str = "FrankaReach-v0"
    """the task to step"""
    num_envs: list[int] = field(default_factory=lambda: [1, 16, 64, 256, 1024])
    """batch sizes to measure"""
    steps: int = 200
    """timed steps per batch size"""
    warmup: int = 20
    """untimed steps first"""
    out: str | None = None
    """also write the table to this Markdown file"""


def env_steps_per_second(env_id: str, num_envs: int, steps: int, warmup: int, **env_kwargs) -> float:
    vec = envs.make(env_id, num_envs=num_envs, seed=0, **env_kwargs)
    low = torch.as_tensor(vec.single_action_space.low)
    high = torch.as_tensor(vec.single_action_space.high)
    vec.reset()
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        vec.step(low + (high - low) * torch.rand(num_envs, len(low)))
    elapsed = time.perf_counter() - start
    vec.close()
    return steps * num_envs / elapsed


def main(args: Args) -> str:
    rows = [f"| num_envs | env-steps/s |", "|---:|---:|"]
    for n in args.num_envs:
        sps = env_steps_per_second(args.env_id, n, args.steps, args.warmup)
        rows.append(f"| {n} | {sps:,.0f} |")
        print(rows[-1], flush=True)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    table = f"Raw {args.env_id} throughput, random actions ({machine}):\n\n" + "\n".join(rows) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    return table


if __name__ == "__main__":
    main(tyro.cli(Args))
