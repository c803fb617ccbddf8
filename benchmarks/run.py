"""Launches the benchmark runs (script x task x seed) as separate processes, then writes the report.

    python benchmarks/run.py --preset quick      # a few minutes on 2 cores
    python benchmarks/run.py --preset full       # the published budgets (hours on 2 cores)
    python benchmarks/report.py --exp-names bench --out-dir runs/reports/full   # the report again, no training

At most --jobs runs at once, each with OMP_NUM_THREADS = cores/jobs (a script's --torch-threads preset may use fewer),
each writing its normal run directory (runs/{env}__{exp_name}__{seed}__{time}). The report goes beside the runs, to
runs/reports/{preset}, unless --out-dir names another folder (benchmarks/results is curated by hand around what the
report tool writes; a runner never overwrites it unasked). Resumable: a finished run is not run again; an unfinished
one continues from its latest checkpoint. With --wandb-group the runs are tracked in W&B under that group.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Literal

import torch
import tyro

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import report  # noqa: E402

# (script, env id, seeds, total steps, extra flags[, experiment suffix]). The full budgets are those of the issues.
ABLATION = {"": [], "post_ln": ["--no-pre-ln"], "gated": ["--gated"], "default_init": ["--no-small-init"]}
# The ablation task: MemoryCue-v0 with 32-step episodes, attended over whole (32 steps, 4 layers); the budget
# ends while the default is still improving, so that a faster or slower start shows.
LONG_CUE = ["--env-kwargs", "length", "32", "max_episode_steps", "32", "--context-len", "32", "--num-layers", "4"]
# ppo_transformer.py's FrankaReachCue-v0 preset before issue 48: history mode over the last 16 steps
HISTORY16 = ["--memory-tokens", "0", "--context-len", "16", "--num-envs", "1024", "--num-steps", "24"]
# The push studies ran with ManiSkill3's gamma 0.8, the push presets' until 2026-12-07 (now 0.95).
PUSH_GAMMA = ["--gamma", "0.8"]
PRESETS = {
    "quick": [
        ("ppo_continuous.py", "Pendulum-v1", (1, 2), 100_000, []),
        ("ppo_continuous.py", "FrankaReach-v0", (1,), 3_000_000, []),
    ],
    "full": [
        ("ppo_continuous.py", "Pendulum-v1", (1, 2, 3), 200_000, []),
        ("ppo_continuous.py", "HalfCheetah-v5", (1, 2, 3), 1_000_000, ["--compile"]),
        ("ppo_continuous.py", "Hopper-v5", (1, 2, 3), 1_000_000, ["--compile"]),
        ("ppo_continuous.py", "FrankaReach-v0", (1, 2, 3), 12_000_000, []),
    ],
    # The rest of CleanRL's MuJoCo references (docs/design.md §8) at their 1M steps, queued task by task so
    # that a stopped session leaves whole tasks (runs resume); reported on their own (--out-dir), not over the full
    # preset's report.
    "mujoco": [("ppo_continuous.py", env_id, (1, 2, 3), 1_000_000, ["--compile"])
               for env_id in ("Walker2d-v5", "InvertedPendulum-v5", "Humanoid-v5")],
    # Partial observability: the memoryless MLP against the recurrent and transformer scripts.
    "memory": [
        ("ppo_continuous.py", "PendulumNoVel-v1", (1, 2, 3), 300_000, []),
        ("ppo_recurrent.py", "PendulumNoVel-v1", (1, 2, 3), 300_000, []),
        ("ppo_transformer.py", "PendulumNoVel-v1", (1, 2, 3), 300_000, []),
    ],
    # Issue 13's target: the BipedalWalker-v3 preset at >= 250 (last 100 training episodes) within 2M steps.
    "bipedal": [("ppo_continuous.py", "BipedalWalker-v3", (1, 2, 3), 2_000_000, [])],
    # Issue 14: the quadruped at the Genesis example's ~10M-step budget; with memory on its NoVel variant.
    "go2": [("ppo_continuous.py", "Go2Walk-v0", (1,), 10_000_000, [])],
    "go2_memory": [(script, "Go2WalkNoVel-v0", (1,), 10_000_000, [])
                   for script in ("ppo_recurrent.py", "ppo_continuous.py", "ppo_transformer.py")],
    # Issue 14's follow-up: every velocity hidden (base and joints), the GRU against the memoryless MLP at 10M steps
    # (seeds 1 and 2), and the transformer (the last 8 steps; seeds 1 and 2) at the 5M that one session's machine
    # time allowed beside them.
    "go2_novelall": [(script, "Go2WalkNoVelAll-v0", (seed,), 10_000_000, []) for seed in (1, 2)
                     for script in ("ppo_recurrent.py", "ppo_continuous.py")]
    + [("ppo_transformer.py", "Go2WalkNoVelAll-v0", (1, 2), 5_000_000, [])],
    # Issue 15: memory on the arm, the three scripts' presets on FrankaReachCue-v0 (target seen in the first 5 of 100
    # steps) at one budget, and the transformer's token mode (4 tokens of the current observation, no history). The
    # transformer's preset was history mode over 16 steps then (its flags here since issue 48's memory mode).
    "arm_memory": [(script, "FrankaReachCue-v0", (seed,), 3_000_000, []) for seed in (1, 2, 3)
                   for script in ("ppo_continuous.py", "ppo_recurrent.py")]
    + [("ppo_transformer.py", "FrankaReachCue-v0", (seed,), 3_000_000, HISTORY16) for seed in (1, 2, 3)]
    + [("ppo_transformer.py", "FrankaReachCue-v0", (1,), 3_000_000,
        ["--memory-tokens", "0", "--context-len", "1", "--num-tokens", "4", "--token-dim", "16", "--num-heads", "2",
         "--num-envs", "1024", "--num-steps", "24"], "tokens")],
    # Issue 48: the transformer's memory mode (its FrankaReachCue-v0 preset: 4 memory tokens carried step to step);
    # seed by seed.
    "arm_memory_transformer": [("ppo_transformer.py", "FrankaReachCue-v0", (seed,), 3_000_000, [], "memory")
                               for seed in (1, 2, 3)],
    # Issue 43's suspects for memory mode's gap to the GRU there, one changed at a time from the preset: GTrXL's gate
    # on each residual (the GRU's own way of keeping and overwriting its state), twice as wide tokens (the memory
    # and the whole transformer: 64 instead of 32), and the memory written through a gate of its own (--memory-gate).
    "arm_memory_variants": [("ppo_transformer.py", "FrankaReachCue-v0", (seed,), 3_000_000, flags, suffix)
                            for seed in (1, 2, 3) for flags, suffix in ((["--gated"], "memory_gated"),
                                                                      (["--token-dim", "64"], "memory_wide"),
                                                                      (["--memory-gate"], "memory_mgate"))],
    # Issue 15: memory on the cube, the three scripts' presets on FrankaPushCubeRandom-v0 (unobserved cube mass and
    # friction) at one budget; seed by seed, so that a stopped session leaves whole seeds (runs resume).
    "push_memory": [(script, "FrankaPushCubeRandom-v0", (seed,), 2_000_000, PUSH_GAMMA) for seed in (1, 2, 3)
                    for script in ("ppo_continuous.py", "ppo_recurrent.py", "ppo_transformer.py")],
    # Issue 43: the recurrent script with a privileged critic (every velocity and the foot contacts; the cue's target)
    # on the two memory tasks where the earlier runs without it are the baselines (go2_novelall, arm_memory: seed 1).
    "privileged": [("ppo_recurrent.py", "Go2WalkNoVelAll-v0", (1,), 10_000_000, ["--privileged-critic"], "privileged"),
                   ("ppo_recurrent.py", "FrankaReachCue-v0", (1,), 3_000_000, ["--privileged-critic"], "privileged")],
    # The MLP's critic reading the cube's drawn mass and frictions (--privileged-critic) against the same preset without
    # it, on FrankaPushCubeRandom-v0 at push_memory's budget; seed by seed, both arms of a seed side by side (seeds 4
    # and 5 came a session after 1-3, with zero-init's: benchmarks/results/franka_cube/README.md).
    "push_privileged": [("ppo_continuous.py", "FrankaPushCubeRandom-v0", (seed,), 2_000_000, PUSH_GAMMA + flags, suffix)
                        for seed in range(1, 6)
                        for flags, suffix in (([], ""), (["--privileged-critic"], "privileged"))],
    # Issue 43's FrankaReachCue-v0 pairs over three seeds: the GRU and the memoryless MLP, each preset with and without
    # the critic that reads the target (--privileged-critic); seed by seed, all four runs of a seed together.
    "arm_privileged": [(script, "FrankaReachCue-v0", (seed,), 3_000_000, flags, suffix) for seed in (1, 2, 3)
                       for script in ("ppo_recurrent.py", "ppo_continuous.py")
                       for flags, suffix in (([], ""), (["--privileged-critic"], "privileged"))],
    # The transformer's stability flags, one changed at a time from the defaults.
    "ablation": [("ppo_transformer.py", "MemoryCue-v0", (1, 2, 3), 16_384, LONG_CUE + flags,
                  f"ablation_{name}".rstrip("_")) for name, flags in ABLATION.items()],
}


@dataclass
class Args:
    preset: Literal["quick", "full", "mujoco", "memory", "ablation", "bipedal", "go2", "go2_memory", "go2_novelall",
                    "arm_memory", "privileged", "push_memory", "push_privileged", "arm_memory_transformer",
                    "arm_privileged", "arm_memory_variants"] = "quick"
    """which runs: quick (minutes), full (the MLP's published budgets), or a study (its comment in PRESETS)"""
    seeds: tuple[int, ...] = ()
    """only these of the preset's seeds (default: all of them)"""
    jobs: int = os.cpu_count() or 1
    """runs at once (no more than there are cores)"""
    exp_name: str | None = None
    """experiment name of the runs (default: bench for full, bench_quick for quick)"""
    wandb_group: str | None = None
    """track the runs in W&B under this group"""
    root: str = REPO
    """working directory of the runs (they write root/runs/...)"""
    out_dir: str | None = None
    """where the report goes (default: root/runs/reports/PRESET, beside the runs: benchmarks/results is curated)"""
    dry_run: bool = False
    """print the commands without running them"""


def find_run(root: str, env_id: str, exp_name: str, seed: int) -> tuple[str | None, bool]:
    """(latest run directory of this env/exp/seed, whether it finished)."""
    dirs = sorted(glob.glob(os.path.join(root, "runs", f"{env_id}__{exp_name}__{seed}__*")))
    if not dirs:
        return None, False
    run_dir = dirs[-1]
    checkpoint = os.path.join(run_dir, "checkpoint.pt")
    if not os.path.isfile(checkpoint):
        return run_dir, False
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return run_dir, state["iteration"] >= state["args"]["num_iterations"]


def experiment_name(args: Args) -> str:
    return args.exp_name or ("bench_quick" if args.preset == "quick" else "bench")


def experiment_of(args: Args, script: str, suffix: str = "") -> str:
    """bench for ppo_continuous.py, bench_recurrent / bench_transformer for the others (plus a variant's suffix):
    run directories are named by task and experiment, so scripts on one task need their own names."""
    name = experiment_name(args)
    if script != "ppo_continuous.py":
        name += "_" + script.removeprefix("ppo_").removesuffix(".py")
    return name + (f"_{suffix}" if suffix else "")


def commands(args: Args) -> list[list[str]]:
    todo = []
    for script, env_id, seeds, steps, extra, *suffix in PRESETS[args.preset]:
        exp_name = experiment_of(args, script, *suffix)
        script = os.path.join(REPO, script)
        for seed in (s for s in seeds if not args.seeds or s in args.seeds):
            run_dir, finished = find_run(args.root, env_id, exp_name, seed)
            if finished:
                print(f"done already: {run_dir}")
                continue
            if run_dir and os.path.isfile(os.path.join(run_dir, "checkpoint.pt")):
                command = [sys.executable, script, "--resume", run_dir, "--no-progress-bar"]
            else:
                command = [sys.executable, script, "--env-id", env_id, "--seed", str(seed), "--total-timesteps",
                           str(steps), "--exp-name", exp_name, "--no-progress-bar", *extra]
            if args.wandb_group:
                command += ["--track", "--wandb-group", args.wandb_group]
            todo.append(command)
    return todo


def main(args: Args) -> None:
    if args.jobs < 1:
        raise SystemExit("error: --jobs must be at least 1")
    preset_seeds = sorted({seed for _, _, seeds, *_ in PRESETS[args.preset] for seed in seeds})
    if unknown := sorted(set(args.seeds) - set(preset_seeds)):
        raise SystemExit(f"error: --seeds {' '.join(map(str, unknown))}: the {args.preset} preset runs seeds "
                         f"{' '.join(map(str, preset_seeds))}; pick among those")
    todo = commands(args)
    threads = str(max(1, (os.cpu_count() or 1) // args.jobs))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    running: list[tuple[subprocess.Popen, list[str]]] = []
    runs_dir = os.path.join(args.root, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    failed = []
    while todo or running:
        while todo and len(running) < args.jobs:
            command = todo.pop(0)
            print("running:", " ".join([os.path.basename(command[1])] + command[2:]), flush=True)
            if args.dry_run:
                continue
            with open(os.path.join(runs_dir, f"bench_{int(time.time() * 1000)}.log"), "w") as log:
                process = subprocess.Popen(command, cwd=args.root, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((process, command))
        for process, command in list(running):
            if process.poll() is not None:
                running.remove((process, command))
                if process.returncode != 0:
                    failed.append(command)
                    print(f"FAILED ({process.returncode}):", " ".join(command[1:]), flush=True)
        time.sleep(1)
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed: see {runs_dir}/bench_*.log")
    if not args.dry_run:
        names = tuple(sorted({experiment_of(args, script, *suffix)
                              for script, _, _, _, _, *suffix in PRESETS[args.preset]}))
        out_dir = args.out_dir or os.path.join(runs_dir, "reports", args.preset)
        report.write_report(report.Args(runs_dir=runs_dir, exp_names=names, out_dir=out_dir))


if __name__ == "__main__":
    main(tyro.cli(Args))
