"""Training throughput beside the simulator alone and the envs/ wrapper, all measured in this one process.

    python benchmarks/train_throughput.py --env-id HalfCheetah-v5 --num-envs 1
    python benchmarks/train_throughput.py --env-id FrankaReach-v0 --num-envs 256 1024
    python benchmarks/train_throughput.py --env-id FrankaReach-v0 --num-envs 1024 \
        --scripts ppo_continuous ppo_recurrent ppo_transformer
    python benchmarks/train_throughput.py --env-id FrankaReachCue-v0 --num-envs 256 --iterations 8 \
        --scripts ppo_transformer "ppo_transformer:memory_tokens=0,context_len=16"

Three columns (docs/design.md §7), from `env_throughput.py`: the simulator alone (plain `gym.make` envs, or the
Genesis scene's own steps), through `envs/` with random actions, and training: each script with its preset for
the task (num_envs overridden; num_steps too, to the first script's, so every script trains on the same batch),
the median SPS over iterations after the first (which warms up). A script may carry flags of its own on top of its
preset, `script:flag=value,flag=value` (Python literals), to set two modes of one script side by side. The
headline is training / simulator alone;
for Genesis tasks "simulator during training" times the scene's own steps inside the training run (the states a
policy visits simulate at another rate than random actions' do) and the headline divides by it;
"vs first" divides a script's training SPS by the first script's, measured in the same process minutes apart.
Measure on an otherwise idle machine: other processes competing for the cores distort the ratios badly.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field

import ast
import dataclasses
import importlib

import gymnasium as gym
import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.env_throughput import env_steps_per_second  # noqa: E402


@dataclass
class Args:
    env_id: str = "HalfCheetah-v5"
    """the task"""
    num_envs: list[int] = field(default_factory=lambda: [1])
    """parallel envs, for both measurements; one row per value"""
    iterations: int = 6
    """training iterations (the first is dropped as warm-up)"""
    raw_steps: int = 4000
    """timed random-action steps (all envs together) for the simulator-alone and envs/ measurements"""
    scripts: list[str] = field(default_factory=lambda: ["ppo_continuous"])
    """scripts to measure (ppo_transformer:context_len=16 sets a flag), all on the first one's batch"""
    out: str | None = None
    """append the result row to this Markdown file"""


def parse_script(spec: str) -> tuple[str, dict]:
    """'ppo_transformer:memory_tokens=0,context_len=16'
    -> ('ppo_transformer', {'memory_tokens': 0, 'context_len': 16})."""
    name, _, flags = spec.partition(":")
    overrides = {}
    for flag in filter(None, flags.split(",")):
        key, _, value = flag.partition("=")
        overrides[key.strip()] = ast.literal_eval(value.strip())
    return name, overrides


def measure(script: str, env_id: str, num_envs: int, num_steps: int | None, iterations: int) -> dict:
    """Training SPS of `script` (median over iterations after the first), the share of time in the rollout, and for
    Genesis tasks the simulator's own steps/s during training (the time inside the scene's steps, the same robot
    states as the policy visits: a trained arm moves differently from random actions, and so simulates at another
    rate)."""
    name, overrides = parse_script(script)
    module = importlib.import_module(name)
    steps = {"num_steps": num_steps} if num_steps else {}  # else the task's own
    train_args = module.task_args(env_id, **{**overrides, "num_envs": num_envs, "progress_bar": False,
                                             "exp_name": "throughput", "checkpoint_interval": 10**9, **steps})
    resolved = module.resolve_args(dataclasses.replace(train_args))
    train_args.total_timesteps = iterations * resolved.batch_size
    threads = torch.get_num_threads()  # a script may set its own (--torch-threads): not for the next one
    scene_seconds, marks, original_step = [0.0], [], None
    if gym.spec(env_id).entry_point is None:  # natively batched (Genesis): time the scene's own steps
        import genesis as gs

        original_step = gs.Scene.step

        def timed_step(scene, *args, **kwargs):
            start = time.perf_counter()
            original_step(scene, *args, **kwargs)
            scene_seconds[0] += time.perf_counter() - start

        gs.Scene.step = timed_step
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            history = module.train(train_args, on_iteration=lambda _: marks.append(scene_seconds[0]))["history"]
        finally:
            os.chdir(cwd)
            torch.set_num_threads(threads)
            if original_step is not None:
                gs.Scene.step = original_step
    simulator_sps = float("nan")
    if original_step is not None:
        simulator_sps = float(np.median([resolved.batch_size / seconds for seconds in np.diff(marks)]))
    return {
        "num_steps": resolved.num_steps,
        "train_sps": float(np.median([h["charts/SPS"] for h in history[1:]])),
        "rollout_fraction": float(np.median([h["time/rollout_s"] / (h["time/rollout_s"] + h["time/update_s"])
                                             for h in history[1:]])),
        "simulator_sps_in_training": simulator_sps,
    }


def main(args: Args) -> list[dict]:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    header = ("| script | env | num_envs x num_steps | simulator alone | through envs/ | simulator during training "
              "| training SPS | **training / simulator** | envs/ / simulator | vs first | rollout share | machine |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print(header)
    if args.out and not os.path.isfile(args.out):
        with open(args.out, "w") as f:
            f.write(header + "\n")
    results = []
    for num_envs in args.num_envs:
        env_sps, alone_sps, _ = env_steps_per_second(args.env_id, num_envs, max(args.raw_steps // num_envs, 50),
                                                     warmup=10)
        num_steps, first_sps = None, None
        for script in args.scripts:
            r = measure(script, args.env_id, num_envs, num_steps, args.iterations)
            num_steps, first_sps = num_steps or r["num_steps"], first_sps or r["train_sps"]
            # The headline divides by the simulator at the states training visits where it can be timed (Genesis)
            simulator = r["simulator_sps_in_training"]
            in_training = f"{simulator:,.0f}" if simulator == simulator else "-"
            simulator = simulator if simulator == simulator else alone_sps
            r.update(script=script, num_envs=num_envs, simulator_sps=alone_sps, env_sps=env_sps,
                     ratio=r["train_sps"] / simulator, vs_first=r["train_sps"] / first_sps)
            label = script.replace(":", ".py ", 1) if ":" in script else f"{script}.py"
            row = (f"| {label} | {args.env_id} | {num_envs} x {num_steps} | {alone_sps:,.0f} | {env_sps:,.0f} "
                   f"| {in_training} | {r['train_sps']:,.0f} | **{r['ratio']:.2f}** | {env_sps / alone_sps:.2f} "
                   f"| {r['vs_first']:.2f} | {r['rollout_fraction']:.2f} | {machine} |")
            print(row, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(row + "\n")
            results.append(r)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
