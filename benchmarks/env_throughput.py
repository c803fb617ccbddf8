"""Raw environment throughput: env-steps/s with uniformly random actions, no policy.

    python benchmarks/env_throughput.py --env-id FrankaReach-v0 --num-envs 1 16 64 256 1024
    python benchmarks/env_throughput.py --env-id Go2Walk-v0 --num-envs 64 256 1024 4096

Prints a Markdown table (and writes it to --out if given). Each batch size gets its own scene
in the same process, one warm-up of --warmup steps, then --steps timed steps. Actions are uniform in the
action space clipped to [-1, 1] (the quadruped's space is the example's +-100 clip, which only saturates).
Three measurements (docs/design.md §7), the ratio of the last two being what `envs/` costs:
- the simulator alone. Genesis tasks: the time spent inside the scene's own `scene.step()` calls (`decimation`
  per agent step) during the timed loop through `envs/`, so both see the same robot states (a separate loop
  without resets would time robots lying on the floor). Gymnasium tasks: `num_envs` separate `gym.make` envs
  stepped one after the other in a plain loop with numpy actions, each reset when its episode ends;
- Gymnasium tasks only: Gymnasium's own vector env (`gym.make_vec`, sync, same-step autoreset), which `envs/`
  builds on;
- through `envs/` (torch actions in, tensors out, final observations, episode statistics, blow-up checks).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
import tyro
from gymnasium.vector import AutoresetMode

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


def gymnasium_steps_per_second(env_id: str, num_envs: int, steps: int, warmup: int) -> tuple[float, float]:
    """(steps/s of `num_envs` plain `gym.make` envs in a loop, steps/s of `gym.make_vec` with same-step autoreset)."""
    singles = [gym.make(env_id) for _ in range(num_envs)]
    space = singles[0].action_space
    space.seed(0)
    actions = [space.sample() for _ in range(256)]  # drawn beforehand: sampling is not the simulator's cost
    for i, env in enumerate(singles):
        env.reset(seed=i)

    def plain_step(step=[0]):
        step[0] += 1
        for env in singles:
            _, _, terminated, truncated, _ = env.step(actions[step[0] % 256])
            if terminated or truncated:
                env.reset()

    vector = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                          vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    vector.reset(seed=0)
    batches = [np.stack([actions[(i + k) % 256] for k in range(num_envs)]) for i in range(256)]

    def vector_step(step=[0]):
        step[0] += 1
        vector.step(batches[step[0] % 256])

    rates = []
    for step in (plain_step, vector_step):
        timed(step, warmup)
        rates.append(steps * num_envs / timed(step, steps))
    for env in [*singles, vector]:
        env.close()
    return rates[0], rates[1]


def env_steps_per_second(env_id: str, num_envs: int, steps: int, warmup: int,
                         **env_kwargs) -> tuple[float, float, float]:
    """(steps/s through envs/, steps/s of the simulator alone: the scene's own steps for Genesis tasks, plain
    `gym.make` envs for Gymnasium tasks, steps/s of `gym.make_vec` for Gymnasium tasks or NaN)."""
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
    actions = [low + (high - low) * torch.rand(num_envs, len(low)) for _ in range(256)]

    def random_step(step=[0]):
        step[0] += 1
        vec.step(actions[step[0] % 256])

    for _ in range(warmup):
        random_step()
    physics_time[0] = 0.0
    through_envs = timed(random_step, steps)
    vec.close()
    if scene is not None:
        alone, vector = steps * num_envs / physics_time[0], float("nan")
    else:
        alone, vector = gymnasium_steps_per_second(env_id, num_envs, steps, warmup)
    return steps * num_envs / through_envs, alone, vector


def main(args: Args) -> str:
    rows = ["| num_envs | simulator alone (steps/s) | Gymnasium make_vec (steps/s) | through envs/ (steps/s) "
            "| envs/ / simulator |", "|---:|---:|---:|---:|---:|"]
    for n in args.num_envs:
        sps, alone, vector = env_steps_per_second(args.env_id, n, args.steps, args.warmup)
        vector = f"{vector:,.0f}" if vector == vector else "-"  # NaN: a natively batched task
        rows.append(f"| {n} | {alone:,.0f} | {vector} | {sps:,.0f} | **{sps / alone:.2f}** |")
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
