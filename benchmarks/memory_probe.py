"""How long a trained policy's memory keeps what its first steps told it: each recorded episode replayed with the
first steps of another in their place, and the two memories compared step by step after them.

    python benchmarks/memory_probe.py --run-dirs runs/MemoryCue-v0__cue100_gru__1__* \\
        runs/MemoryCue-v0__cue100_memory__1__*
    python benchmarks/memory_probe.py --from-step 4 --out benchmarks/results/franka_cube/memory_probe.md \\
        --run-dirs runs/FrankaReachCue-v0__priv3_recurrent__1__* runs/FrankaReachCue-v0__bench_transformer_memory__2__*

Each run's last checkpoint, as deployed (its script's DeployedPolicy: the frozen normaliser, the mean action), plays
--envs episodes of its task for up to --steps steps (fewer if one ends sooner), and their observations are recorded.
Each episode is then replayed open loop twice: as it was, and with its steps 0..--from-step taken from the previous
episode (a cue seen in those steps swapped for another's), the later observations the same. The memory is the
recurrent state the policy carries (the GRU's or LSTM's state, the transformer's memory tokens). Reported per run, the
median over the pairs whose first steps differ: how far apart the two memories are k steps after --from-step, as a
share of how far apart they were at it (1: the difference kept whole; 0: forgotten), and how far apart the two
actions are (the env's units). A policy that has to act at the episode's end on a cue seen in its first steps needs
the difference kept to the end. A linear measure (the memory's Jacobian) says less: a GRU holding a cue in a
saturated state forgets small nudges by design and keeps the cue. A memoryless run (the MLP, the transformer's
history mode) carries no such state and is refused.
"""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import dataclass

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.report import in_child, script_of  # noqa: E402

LAGS = (1, 5, 20, 50)  # steps after --from-step reported, beside the last one


@dataclass
class Args:
    run_dirs: tuple[str, ...]
    """run directories (their checkpoint.pt): ppo_recurrent.py runs or ppo_transformer.py runs in memory mode"""
    from_step: int = 0
    """steps 0 to this one are swapped between episodes, the memories followed after it (FrankaReachCue-v0: 4)"""
    steps: int = 100
    """steps of each recorded episode (fewer if an episode ends sooner)"""
    envs: int = 16
    """episodes recorded (one per env; its evaluation's episodes)"""
    out: str | None = None
    """also write the table to this Markdown file"""


def prefix_effect(policy, observations: torch.Tensor, from_step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`observations` (T, B, obs_dim) replayed open loop through `policy` (a DeployedPolicy: obs, *memory -> action,
    *memory, its last memory tensor the recurrent state) as they are and with each episode's steps 0..from_step
    those of the episode before it. Returns, for t = from_step + 1 .. T - 1, the memories' distance at t over their
    distance at from_step, and the actions' distance at t, each (T - from_step - 1, pairs): only the pairs whose
    memories differ at from_step (episodes whose first steps are alike tell nothing)."""
    T, B = observations.shape[:2]
    swapped = observations.clone()
    swapped[: from_step + 1] = observations[: from_step + 1].roll(1, dims=1)
    both = torch.cat([observations, swapped], 1)  # (T, 2B, obs_dim): own first steps, then another's
    memory = policy.initial_memory(2 * B, observations.device)
    ratios, action_gaps = [], []
    with torch.no_grad():
        for t in range(T):
            action, *memory = policy(both[t], *memory)
            gap = (memory[-1][:B] - memory[-1][B:]).flatten(1).norm(dim=1)
            if t == from_step:
                differ = gap > 1e-6 * memory[-1][:B].flatten(1).norm(dim=1).clamp_min(1e-12)
                first_gap = gap[differ]
            elif t > from_step:
                ratios.append(gap[differ] / first_gap)
                action_gaps.append((action[:B] - action[B:]).norm(dim=1)[differ])
    return torch.stack(ratios), torch.stack(action_gaps)


def probe_run(run_dir: str, args: Args) -> dict:
    """One run's memory followed along its own recorded episodes (call in a child: Genesis keeps a destroyed scene's
    memory). Returns its script, memory size, episode length, pairs and, per lag, the median share kept and the
    median distance of the actions."""
    import importlib

    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), map_location="cpu", weights_only=True)
    script = importlib.import_module(script_of(checkpoint["args"]).removesuffix(".py"))
    run_args = script.args_from_checkpoint(checkpoint)
    device = torch.device("cpu")
    vec = script.evaluation_envs(run_args, args.envs, device)  # its evaluation's: first episodes not staggered
    policy = script.deployed_policy(run_args, vec, checkpoint, device)
    obs, _ = vec.reset(seed=run_args.seed + script.EVAL_SEED_OFFSET)
    observations, memory = [obs], policy.initial_memory(vec.num_envs, device)
    with torch.inference_mode():
        while len(observations) < args.steps:
            action, *memory = policy(observations[-1], *memory)
            obs, _, terminated, truncated, _ = vec.step(action)
            if (terminated | truncated).any():  # the next observation is of another episode
                break
            observations.append(obs)
    vec.close()
    recorded = torch.stack(observations).clone()
    if len(recorded) <= args.from_step + 1:
        raise ValueError(f"--from-step {args.from_step}: the episodes ended after {len(recorded)} steps; "
                         f"give a step before their last")
    ratios, action_gaps = prefix_effect(policy, recorded, args.from_step)
    if ratios.shape[1] == 0:
        raise ValueError(f"--from-step {args.from_step}: the recorded episodes' first steps are all alike; record "
                         "more (--envs) or follow a later step")
    lags = [lag for lag in LAGS if lag < len(ratios)] + [len(ratios)]
    return {"script": script_of(checkpoint["args"]), "size": memory[-1][0].numel(), "steps": len(recorded),
            "pairs": ratios.shape[1], "lags": lags, "kept": [ratios[lag - 1].median().item() for lag in lags],
            "action_gap": [action_gaps[lag - 1].median().item() for lag in lags]}


def main(args: Args) -> str:
    if not 0 <= args.from_step < args.steps - 1:
        raise SystemExit(f"error: --from-step {args.from_step}: give a step from 0 to --steps - 2 ({args.steps - 2}), "
                         "so that steps follow it")
    run_dirs = [path for pattern in args.run_dirs for path in sorted(glob.glob(pattern)) or [pattern]]
    for run_dir in run_dirs:
        path = os.path.join(run_dir, "checkpoint.pt")
        if not os.path.isfile(path):
            raise SystemExit(f"error: --run-dirs {run_dir}: no checkpoint.pt there; give a run directory from runs/")
        saved = torch.load(path, map_location="cpu", weights_only=True)["args"]
        if script_of(saved) == "ppo_continuous.py" or saved.get("memory_tokens") == 0:
            raise SystemExit(f"error: --run-dirs {run_dir}: {script_of(saved)} without memory carries no state to "
                             "probe; give a ppo_recurrent.py run or a ppo_transformer.py run with --memory-tokens")
    lines = [f"The first {args.from_step + 1} steps of each recorded evaluation episode swapped for the previous "
             f"episode's: the memories' distance k steps after step {args.from_step}, as a share of their distance "
             "at it (1: kept whole, 0: forgotten), and in brackets the actions' distance; medians over the pairs "
             "whose first steps differ (`python benchmarks/memory_probe.py`)."]
    header = None
    for run_dir in run_dirs:
        try:
            result = in_child(probe_run, run_dir, args)
        except ValueError as error:
            raise SystemExit(f"error: {run_dir}: {error}") from None
        columns = [f"{lag} step{'s' * (lag > 1)} on" for lag in result["lags"][:-1]] + [
            f"step {result['steps'] - 1}"]
        if columns != header:  # a table per episode length
            header = columns
            lines += ["", f"| run | script | memory size | pairs | {' | '.join(columns)} |",
                      "|---|---|---:|---:|" + "---:|" * len(columns)]
        cells = [f"{kept:.3g} ({gap:.3g})" for kept, gap in zip(result["kept"], result["action_gap"])]
        lines.append(f"| {os.path.basename(run_dir)} | {result['script']} | {result['size']} | {result['pairs']} "
                     f"| {' | '.join(cells)} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
