"""Checks for a CUDA machine (issue 51, docs/benchmarks.md): simulator throughput on the GPU, and where a script's
rollout waits on the GPU.

    python benchmarks/gpu_checks.py sim --env-ids Go2Walk-v0 FrankaReach-v0 --num-envs 1024 4096
    python benchmarks/gpu_checks.py syncs --env-id Go2Walk-v0 --num-envs 4096
    python benchmarks/gpu_checks.py busy --env-id Go2Walk-v0 --num-envs 4096 --trace go2_trace.json
    python benchmarks/gpu_checks.py same --run-dirs runs/<straight> runs/<a copy resumed mid-run>

`sim`: each task built on `gs.gpu` with its tensors on CUDA, stepped with random actions: the first build's time
(kernel compile included when the cache is cold), then env-steps/s through `envs/` and of the scene's own steps
alone, the GPU synchronised around each timed stretch so that queued work is counted.

`busy`: a script's fourth iteration traced with torch.profiler: the GPU's kernel time (every kernel the profiler
records, Genesis's among them: the third GPU session's trace shows them) against the wall time of the second
iteration (the same work), timed with the profiler off (not in its warm-up, the third, where CUPTI already records
the GPU): near 100% the GPU is the limit, far below it the host is (Python and kernel launches), which decides
what to make faster; the ops by GPU time, and a Chrome trace if asked for.

`syncs`: each script trains a few iterations on CUDA with `torch.cuda.set_sync_debug_mode("warn")`, once with
--num-steps S and once with 2S; every warning is counted by the innermost line of this project's code (a script's
or envs/) that led to it. A line whose count doubles with the steps synchronises once per rollout step (the design
forbids it in the scripts, and allows envs/ only its resets' nonzeros: docs/design.md); lines that stay the same
run once per iteration (logging, the update's early stop).

`same`: whether two runs logged the same values (every TensorBoard scalar but the timings) at the steps both
logged: a copy of a run's directory resumed from a middle checkpoint against the run itself, on the device
under test (a resumed run continues the uninterrupted one exactly where the simulation repeats itself).
"""

from __future__ import annotations

import collections
import functools
import importlib
import json
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Literal

import torch
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import envs  # noqa: E402


@dataclass
class Sim:
    env_ids: list[str] = field(default_factory=lambda: ["Go2Walk-v0", "FrankaReach-v0"])
    """the tasks to step"""
    num_envs: list[int] = field(default_factory=lambda: [1024, 4096])
    """batch sizes to measure"""
    steps: int = 200
    """timed steps per batch size"""
    warmup: int = 20
    """untimed steps first"""
    sim_device: str = "gpu"
    """where Genesis simulates (cpu to try this script without a GPU)"""
    padded_contacts: bool = False
    """read the robot's contacts padded (Genesis's is_padded=True: no wait for the trimmed count, more to gather)"""


@dataclass
class Syncs:
    env_id: str = "Go2Walk-v0"
    """the task to train on"""
    scripts: list[str] = field(default_factory=lambda: ["ppo_continuous", "ppo_recurrent", "ppo_transformer"])
    """the scripts to check"""
    num_envs: int = 4096
    """envs per run"""
    num_steps: int = 12
    """rollout length of the first run (the second takes twice as many)"""
    iterations: int = 2
    """iterations per run"""


@dataclass
class Busy:
    script: str = "ppo_continuous"
    """the script to trace"""
    env_id: str = "Go2Walk-v0"
    """the task to train on"""
    num_envs: int = 4096
    """envs of the run"""
    hidden_sizes: list[int] = field(default_factory=lambda: [512, 256, 128])
    """the networks' hidden layers (Genesis's Go2 example's)"""
    num_steps: int = 0
    """rollout steps per env (0: the task's preset)"""
    update_epochs: int = 0
    """epochs per update (0: the task's preset)"""
    num_minibatches: int = 0
    """minibatches per epoch (0: the task's preset)"""
    rows: int = 30
    """ops listed, by GPU time (by CPU time without a GPU)"""
    trace: str = ""
    """a Chrome trace of the traced iteration to write (empty: none)"""
    compile: bool = False
    """trace the script's --compile run (its compiled acting and loss; compiling happens in the first iteration)"""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """the script's --compile-mode with --compile (reduce-overhead: CUDA graphs)"""


@dataclass
class Same:
    run_dirs: list[str]
    """two run directories: the straight run and a copy of it resumed from a middle checkpoint"""


# What differs between two identical runs: the clock
TIMINGS = ("charts/SPS", "time/")


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def sim(args: Sim) -> None:
    device = "cuda" if args.sim_device == "gpu" else "cpu"
    print(f"contacts {'padded' if args.padded_contacts else 'trimmed'}")
    print("| task | envs | first build (s) | steps/s through envs/ | steps/s of the scene alone |")
    print("|---|---:|---:|---:|---:|")
    for env_id in args.env_ids:
        for num_envs in args.num_envs:
            started = time.perf_counter()
            vec = envs.make(env_id, num_envs=num_envs, seed=0, device=device, sim_device=args.sim_device)
            if args.padded_contacts:  # the tasks trim (docs/tasks.md): this measures what padding would change
                vec.robot.get_contacts = functools.partial(vec.robot.get_contacts, is_padded=True)
            vec.reset()
            synchronize()
            build_s = time.perf_counter() - started
            scene_step, scene_s = vec.scene.step, [0.0]

            def timed_scene_step(*a, **kw):
                synchronize()
                start = time.perf_counter()
                scene_step(*a, **kw)
                synchronize()
                scene_s[0] += time.perf_counter() - start

            vec.scene.step = timed_scene_step
            low = torch.as_tensor(vec.single_action_space.low, device=device).clamp(min=-1.0)
            high = torch.as_tensor(vec.single_action_space.high, device=device).clamp(max=1.0)
            actions = [low + (high - low) * torch.rand(num_envs, len(low), device=device) for _ in range(64)]
            for i in range(args.warmup):
                vec.step(actions[i % 64])
            synchronize()
            scene_s[0], started = 0.0, time.perf_counter()
            for i in range(args.steps):
                vec.step(actions[i % 64])
            synchronize()
            through = time.perf_counter() - started
            vec.close()
            print(f"| {env_id} | {num_envs} | {build_s:.1f} | {args.steps * num_envs / through:,.0f} | "
                  f"{args.steps * num_envs / scene_s[0]:,.0f} |", flush=True)


def sync_counts(module, args: Syncs, num_steps: int) -> collections.Counter:
    """Sync warnings per (file, line) over `iterations` iterations of `num_steps` steps, the run's own lines."""
    run_args = module.task_args(
        args.env_id, num_envs=args.num_envs, num_steps=num_steps, cuda=True, progress_bar=False, eval_interval=0,
        checkpoint_interval=1000, total_timesteps=args.iterations * num_steps * args.num_envs, exp_name="syncs")
    counts = collections.Counter()

    def count(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        # the innermost frame of this project's code (the warning's own frame may be inside torch)
        ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(ROOT) and not any(
                part in f.filename for part in ("gpu_checks", "site-packages", ".venv"))]
        counts[f"{os.path.relpath(ours[-1].filename, ROOT)}:{ours[-1].lineno}" if ours else f"{filename}:{lineno}"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = count
        torch.cuda.set_sync_debug_mode("warn")
        try:
            module.train(run_args)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return counts


def gpu_kernel_time(events) -> tuple[float, int]:
    """The seconds in which the GPU ran at least one kernel, and the kernels' count. The profiler also lists its
    annotations (`ProfilerStep#N`, the optimiser's step) as GPU events spanning whole stretches: they are not
    kernels. Overlapping kernels (several streams) count once."""
    from torch.autograd import DeviceType

    spans = sorted((event.time_range.start, event.time_range.end) for event in events
                   if event.device_type == DeviceType.CUDA and not event.is_user_annotation)
    busy_us, covered_until = 0.0, float("-inf")
    for start, end in spans:
        busy_us += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    return busy_us / 1e6, len(spans)


def busy(args: Busy) -> dict:
    """Trains four iterations, tracing the fourth; prints and returns the second's wall time (the profiler off: the
    third is its warm-up, where CUPTI already records the GPU), the fourth's (slower: the profiler's own cost) and
    the GPU's kernel time and count in the fourth."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    module = importlib.import_module(args.script)
    cuda = torch.cuda.is_available()
    run_args = module.task_args(
        args.env_id, num_envs=args.num_envs, cuda=cuda, progress_bar=False, eval_interval=0, checkpoint_interval=1000,
        hidden_sizes=tuple(args.hidden_sizes), exp_name="busy", compile=args.compile,
        compile_mode=args.compile_mode,
        **{name: getattr(args, name) for name in ("num_steps", "update_epochs", "num_minibatches")
           if getattr(args, name)})
    run_args.total_timesteps = 4 * run_args.num_steps * args.num_envs
    ends = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, schedule=schedule(wait=2, warmup=1, active=1, repeat=1)) as prof:

        def iteration_done(metrics: dict) -> None:
            synchronize()
            ends.append(time.perf_counter())
            prof.step()

        module.train(run_args, on_iteration=iteration_done)
    kernel_s, kernels = gpu_kernel_time(prof.events())
    report = {"untraced_s": ends[1] - ends[0], "traced_s": ends[3] - ends[2], "kernel_s": kernel_s, "kernels": kernels,
              "traced_iterations": sum(event.name.startswith("ProfilerStep") and event.device_type == DeviceType.CPU
                                       for event in prof.events())}
    print(f"{args.script} on {args.env_id}, {args.num_envs} envs: iteration 2 {report['untraced_s']:.3f} s "
          f"(untraced); iteration 4 {report['traced_s']:.3f} s (traced): {report['kernels']} GPU kernels, "
          f"{report['kernel_s']:.3f} s of GPU time, {report['kernel_s'] / report['untraced_s']:.0%} of iteration 2")
    sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort_by, row_limit=args.rows, max_name_column_width=60))
    if args.trace:
        prof.export_chrome_trace(args.trace)
    print(json.dumps(report), flush=True)
    return report


def syncs(args: Syncs) -> None:
    report = {}
    for name in args.scripts:
        module = importlib.import_module(name)
        short, long = (sync_counts(module, args, steps) for steps in (args.num_steps, 2 * args.num_steps))
        per_step = {line: [short[line], long[line]] for line in sorted(set(short) | set(long))
                    if long[line] > short[line]}
        report[name] = {"syncs": [sum(short.values()), sum(long.values())], "growing_with_steps": per_step}
        print(f"{name}: {args.num_steps} steps {sum(short.values())} syncs, {2 * args.num_steps} steps "
              f"{sum(long.values())}; lines growing with the steps: {per_step or 'none'}", flush=True)
    print(json.dumps(report))


def logged_values(run_dir: str) -> dict[str, dict[int, float]]:
    """A run directory's scalars, tag -> {step: value}, timings left out; what a resume purged is gone (TensorBoard's
    reader drops the events of the steps a later session logged again)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {event.step: event.value for event in events.Scalars(tag)}
            for tag in events.Tags()["scalars"] if not tag.startswith(TIMINGS)}


def same(args: Same) -> dict:
    if len(args.run_dirs) != 2:
        raise SystemExit(f"--run-dirs: give two run directories, got {len(args.run_dirs)}")
    first, second = (logged_values(run_dir) for run_dir in args.run_dirs)
    compared, differing = 0, []
    for tag in sorted(set(first) & set(second)):
        for step in sorted(set(first[tag]) & set(second[tag])):
            compared += 1
            if first[tag][step] != second[tag][step]:
                differing.append((step, tag, first[tag][step], second[tag][step]))
    differing.sort()
    report = {"compared": compared, "differing": len(differing),
              "first_difference": list(differing[0]) if differing else None,
              "tags_only_in_one": sorted(set(first) ^ set(second))}
    if not compared:
        print(f"same: no values logged by both {args.run_dirs[0]} and {args.run_dirs[1]} at one step")
    elif differing:
        step, tag, a, b = differing[0]
        print(f"same: {len(differing)} of {compared} values differ; the first at step {step}: {tag} {a!r} against "
              f"{b!r}")
    else:
        print(f"same: all {compared} values logged by both runs are equal")
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    command = tyro.extras.subcommand_cli_from_dict({"sim": Sim, "syncs": Syncs, "busy": Busy, "same": Same})
    {Sim: sim, Syncs: syncs, Busy: busy, Same: same}[type(command)](command)
