"""Raw environment throughput: env-steps/s with uniformly random actions, no policy.

    python benchmarks/env_throughput.py --env-id FrankaReach-v0 --num-envs 1 16 64 256 1024
    python benchmarks/env_throughput.py --env-id Go2Walk-v0 --num-envs 64 256 1024 4096

Prints a Markdown table (and writes it to --out if given). Each batch size gets its own scene
in the same process, one warm-up of --warmup steps, then --steps timed steps. Actions are uniform in the
action space clipped to [-1, 1] (the quadruped's space is the example's +-100 clip, which only saturates).
For natively batched Genesis tasks a second column is the simulator alone: the time spent inside the scene's
own `scene.step()` calls (`decimation` per agent step) during the same timed loop, so both columns see the same
robot states (a separate loop without resets would time robots lying on the floor instead); the ratio between
the columns is what `envs/` costs (actions, observations, rewards, resets, bookkeeping).
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


def timed(step, steps: int) -> float:
    """Seconds for `steps` calls of `step()`."""
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - start


def env_steps_per_second(env_id: str, num_envs: int, steps: int, warmup: int, **env_kwargs) -> tuple[float, float]:
    """(steps/s through envs/, steps/s of the simulator alone, or NaN for tasks without a scene of their own)."""
    vec = envs.make(env_id, num_envs=num_envs, seed=0, **env_kwargs)
    low = torch.as_tensor(vec.single_action_space.low).clamp(min=-1.0)
    high = torch.as_tensor(vec.single_action_space.high).clamp(max=1.0)
    vec.reset()
    scene = getattr(vec, "scene", None)
    physics_time = [0.0]
    if scene is not None:  # time the scene's own steps inside the same loop: the same robot states, falls and all
        scene_step = scene.step

        def timed_scene_step(*args, **kwargs):
            start = time.perf_counter()
            scene_step(*args, **kwargs)
            physics_time[0] += time.perf_counter() - start

        scene.step = timed_scene_step
    def random_step():
        vec.step(low + (high - low) * torch.rand(num_envs, len(low)))

    for _ in range(warmup):
        random_step()
    physics_time[0] = 0.0
    through_envs = timed(random_step, steps)
    alone = steps * num_envs / physics_time[0] if scene is not None else float("nan")
    vec.close()
    return steps * num_envs / through_envs, alone


def main(args: Args) -> str:
    rows = ["| num_envs | simulator alone (steps/s) | through envs/ (steps/s) | envs/ / simulator |", "|---:|---:|---:|---:|"]
    for n in args.num_envs:
        sps, alone = env_steps_per_second(args.env_id, n, args.steps, args.warmup)
        known = alone == alone  # NaN: a Gymnasium task (no scene of its own to time)
        rows.append(f"| {n} | {f'{alone:,.0f}' if known else '-'} | {sps:,.0f} | {f'{sps / alone:.2f}' if known else '-'} |")
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
