"""CleanRL's `ppo_continuous_action.py` and our `ppo_continuous.py` side by side on HalfCheetah, in one sitting.

    python benchmarks/cleanrl_side_by_side.py --out benchmarks/results/cleanrl_side_by_side.md

CleanRL runs as published, in a virtual environment of its own that this benchmark creates once (under --venv)
with the versions CleanRL pins for MuJoCo (gymnasium 0.29.1, mujoco 2.3.3, numpy 1.24.4, tyro 0.5.10) and our
torch; its script is CleanRL's file at a pinned commit (downloaded into the venv, or --cleanrl-script PATH).
CleanRL's HalfCheetah is v4 (what gymnasium 0.29 offers with its defaults), ours v5: each is normalised by its
own simulator alone, stepped the same way in its own environment (one plain `gym.make` env, random actions).

Rounds alternate A B A B: our simulator, our training, CleanRL's simulator, CleanRL's training (as a user runs it:
torch's default threads), then CleanRL with one torch thread (as our Gymnasium preset runs). Training SPS is the
median over iterations after the first (CleanRL prints its SPS since the start; per-iteration rates are
recovered from consecutive prints). The last column is what each script spends per step besides simulating
(1/training SPS - 1/simulator SPS): acting, wrappers, bookkeeping and its share of the update. Measure on an
otherwise idle machine.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from dataclasses import dataclass

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.env_throughput import gymnasium_steps_per_second  # noqa: E402
from benchmarks.train_throughput import measure  # noqa: E402

CLEANRL_COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"
CLEANRL_URL = f"https://raw.githubusercontent.com/vwxyzjn/cleanrl/{CLEANRL_COMMIT}/cleanrl/ppo_continuous_action.py"
CLEANRL_PACKAGES = ["gymnasium[mujoco]==0.29.1", "mujoco==2.3.3", "numpy==1.24.4", "tyro==0.5.10",
                    "tensorboard==2.14.0"]
CLEANRL_BATCH = 2048  # its defaults: 1 env x 2048 steps, as ours on Gymnasium tasks

# CleanRL's simulator alone, run by the venv's python: the same plain loop as ours (one gym.make env).
SIMULATOR_ALONE = textwrap.dedent("""
    import sys, time, gymnasium as gym
    env = gym.make(sys.argv[1]); env.action_space.seed(0); env.reset(seed=0)
    actions = [env.action_space.sample() for _ in range(256)]
    def run(steps):
        start = time.perf_counter()
        for i in range(steps):
            _, _, terminated, truncated, _ = env.step(actions[i % 256])
            if terminated or truncated:
                env.reset()
        return steps / (time.perf_counter() - start)
    run(int(sys.argv[3]))
    print(run(int(sys.argv[2])))
""")


@dataclass
class Args:
    venv: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cleanrl-venv")
    """CleanRL's virtual environment (created with its pinned packages if missing)"""
    cleanrl_script: str | None = None
    """CleanRL's ppo_continuous_action.py (None: downloaded from GitHub at the pinned commit into the venv)"""
    rounds: int = 2
    """A B A B rounds"""
    iterations: int = 6
    """training iterations per run (2048 steps each; the first is dropped as warm-up)"""
    sim_steps: int = 5000
    """timed steps for each simulator-alone measurement"""
    out: str | None = None
    """write the Markdown table to this file"""


class SetupError(RuntimeError):
    """CleanRL's environment or script could not be prepared (the message says which step and why)."""


def run(command: list[str], what: str, env: dict | None = None, cwd: str | None = None) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise SetupError(f"{what} failed (exit {result.returncode}): " + " | ".join(tail))
    return result.stdout


def prepare_cleanrl(args: Args) -> tuple[str, str]:
    """(the venv's python, CleanRL's script), creating the venv and fetching the script if needed."""
    python = os.path.join(args.venv, "bin", "python")
    if not os.path.exists(os.path.join(args.venv, "ready")):
        run([sys.executable, "-m", "venv", args.venv], "creating the venv")
        torch_version = torch.__version__.split("+")[0]  # first, so pip keeps the CPU build as ours
        run([python, "-m", "pip", "install", "--quiet", f"torch=={torch_version}"], "installing torch")
        run([python, "-m", "pip", "install", "--quiet", *CLEANRL_PACKAGES], "installing CleanRL's packages")
        open(os.path.join(args.venv, "ready"), "w").close()
    script = args.cleanrl_script or os.path.join(args.venv, f"ppo_continuous_action_{CLEANRL_COMMIT[:8]}.py")
    if not os.path.exists(script):
        try:
            urllib.request.urlretrieve(CLEANRL_URL, script + ".part")
        except OSError as error:
            raise SetupError(f"downloading {CLEANRL_URL} failed ({error}); download it elsewhere and pass "
                             "--cleanrl-script PATH") from None
        os.replace(script + ".part", script)
    return python, os.path.abspath(script)


def cleanrl_training_sps(python: str, script: str, iterations: int, threads: int | None) -> float:
    """CleanRL's training SPS: the median over iterations after the first, from its cumulative "SPS:" prints."""
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    with tempfile.TemporaryDirectory() as tmp:  # it writes runs/ into the working directory
        out = run([python, script, "--env-id", "HalfCheetah-v4", "--no-cuda",
                   "--total-timesteps", str(iterations * CLEANRL_BATCH)], "CleanRL's training run", env=env, cwd=tmp)
    cumulative = [int(x) for x in re.findall(r"^SPS: (\d+)", out, flags=re.M)]
    return statistics.median(per_iteration_sps(cumulative, CLEANRL_BATCH))


def per_iteration_sps(cumulative: list[float], batch: int) -> list[float]:
    """Each iteration's SPS after the first, from SPS figures averaged since the start (CleanRL's "SPS:" prints)."""
    elapsed = [batch * (i + 1) / sps for i, sps in enumerate(cumulative)]  # seconds since the start
    return [batch / (b - a) for a, b in zip(elapsed, elapsed[1:])]


def main(args: Args) -> str:
    python, script = prepare_cleanrl(args)
    rows = []
    for round_ in range(1, args.rounds + 1):
        ours_sim = gymnasium_steps_per_second("HalfCheetah-v5", 1, args.sim_steps, warmup=200)[0]
        ours = measure("ppo_continuous", "HalfCheetah-v5", 1, None, args.iterations)["train_sps"]
        rows.append(("ppo_continuous.py (ours)", "HalfCheetah-v5", "1 (preset)", round_, ours_sim, ours))
        clean_sim = float(run([python, "-c", SIMULATOR_ALONE, "HalfCheetah-v4", str(args.sim_steps), "200"],
                              "CleanRL's simulator alone"))
        for threads, label in ((None, f"default ({torch.get_num_threads()})"), (1, "1")):
            clean = cleanrl_training_sps(python, script, args.iterations, threads)
            rows.append(("CleanRL ppo_continuous_action.py", "HalfCheetah-v4", label, round_, clean_sim, clean))
        for row in rows[-3:]:
            print(row, flush=True)

    def median_of(name: str, threads: str | None = None) -> tuple[float, float]:
        selected = [r for r in rows if r[0] == name and (threads is None or r[2] == threads)]
        return (statistics.median(r[5] for r in selected), statistics.median(r[5] / r[4] for r in selected))

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    lines = [f"HalfCheetah, one env, 2048 steps per iteration, {args.iterations} iterations per run, rounds A B A B "
             f"({machine}; CleanRL at commit {CLEANRL_COMMIT[:8]}):", "",
             "| script | env | torch threads | round | simulator alone (steps/s) | training SPS "
             "| **training / simulator** | time per step outside the simulator (µs) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {env_id} | {threads} | {r} | {sim:,.0f} | {sps:,.0f} | **{sps / sim:.3f}** "
              f"| {1e6 / sps - 1e6 / sim:,.0f} |" for name, env_id, threads, r, sim, sps in rows]
    ours_sps, ours_ratio = median_of("ppo_continuous.py (ours)")
    lines.append("")
    for label in sorted({r[2] for r in rows if r[0].startswith("CleanRL")}):
        clean_sps, clean_ratio = median_of("CleanRL ppo_continuous_action.py", label)
        lines.append(f"- Medians, CleanRL with {label} torch threads: ours {ours_sps:,.0f} SPS "
                     f"({ours_ratio:.3f} of its simulator), CleanRL {clean_sps:,.0f} SPS ({clean_ratio:.3f} of its "
                     f"simulator): ours / CleanRL "
                     f"= **{ours_sps / clean_sps:.2f}x** in SPS, **{ours_ratio / clean_ratio:.2f}x** normalised.")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    return table


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except SetupError as error:
        sys.exit(f"cleanrl_side_by_side.py: {error}")
