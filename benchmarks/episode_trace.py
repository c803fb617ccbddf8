"""What trained policies do over an episode, step by step: each reward term of their task, and the size of their
action, at every step of the evaluation's first episodes.

    python benchmarks/episode_trace.py --steps 100 --at 0 5 10 20 40 60 80 99 \\
        --out benchmarks/results/franka_cube/franka_reachcue_trace \\
        --run-dirs "runs/FrankaReachCue-v0__mem_recurrent__1__*" "runs/FrankaReachCue-v0__reachcue_memory_from50__*"

Each run's last checkpoint (checkpoint.pt), as deployed (its script's DeployedPolicy: the frozen normaliser, the mean
action), plays --envs episodes of its task, the evaluation's (its seed, first episodes not staggered), for --steps
steps. Recorded at every step: the task's reward terms as its envs report them (`info["reward_terms"]`, logged in
training under reward_terms/), weighted as in the reward, and the norm of the action; each averaged over the episodes
still running at that step. Writes <out>.md (per run, the steps in --at) and <out>.png (each term against the step,
a line per run). A task whose envs report no reward terms (Gymnasium's) is refused. --env-kwargs changes the task as the
scripts' --eval-checkpoint does (on top of each run's own options; the policy's observation and action must keep
their sizes), but takes no ranges.

On the Panda reach tasks the distance term is minus the fingertip's distance to the target (m) and the success bonus
+0.5 at each step inside the 2-cm ball (its mean is half the share of the episodes inside the ball at that step; at
the last step, half the success rate): when a policy gets to the target, and whether it stays there. The arm's
action moves the joint-position command, so an action of zero keeps the command where it is: with --hold-from N the
envs get zeros from step N on, and the trace after N is how the episode would end had the policy stopped commanding
there (the arm settles at its last command, which may lie ahead of where the arm was).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
from dataclasses import dataclass

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.report import in_child, script_of  # noqa: E402

ACTION = "action_norm"  # the action's norm, reported beside the reward terms


@dataclass
class Args:
    run_dirs: tuple[str, ...]
    """run directories (their checkpoint.pt), any of the three scripts; a glob each"""
    steps: int = 100
    """steps of each episode followed (the episodes that end sooner drop out of the later steps' means)"""
    envs: int = 64
    """episodes followed (one per env: the evaluation's first episodes)"""
    hold_from: int | None = None
    """from this step on the envs get zeros in place of the policy's action (the arm tasks: the joint command held)"""
    at: tuple[int, ...] = (0, 5, 10, 20, 40, 60, 80, 99)
    """the steps tabulated in the Markdown file (the plot has them all)"""
    env_kwargs: dict[str, int | float | bool | str] | None = None
    """options on top of each run's own, e.g. cue_steps 100 (numbers, booleans and words; a "low,high" range is not
    read as one here, as the scripts' --env-kwargs reads it)"""
    out: str | None = None
    """write <out>.md and <out>.png"""


@torch.inference_mode()
def trace_episodes(policy, vec, steps: int, seed: int, hold_from: int | None = None) -> dict[str, torch.Tensor]:
    """`policy` (a DeployedPolicy: obs, *memory -> action, *memory) playing `vec`'s first episodes from a reset with
    `seed`, for up to `steps` steps; from step `hold_from` on (if given) the envs get zeros in place of its action.
    Returns each reward term's mean over the episodes still running at each step, the action's norm (ACTION)
    likewise, and "running", how many those were: each a (steps,) tensor; a step after every episode ended is not
    returned."""
    obs, _ = vec.reset(seed=seed)
    memory = policy.initial_memory(vec.num_envs, obs.device)
    running = torch.ones(vec.num_envs, dtype=torch.bool, device=obs.device)
    sums: dict[str, list[torch.Tensor]] = {}
    for step in range(steps):
        action, *memory = policy(obs, *memory)
        if hold_from is not None and step >= hold_from:
            action = torch.zeros_like(action)
        obs, _, terminated, truncated, info = vec.step(action)
        if "reward_terms" not in info:
            raise ValueError("its task's envs report no reward terms (info['reward_terms']); give a run of one "
                             "that does (the Genesis tasks)")
        # a step of an episode's counts for it, its last one too; the envs' next episodes count nowhere
        values = {**info["reward_terms"], ACTION: action.norm(dim=-1)}
        for name, value in values.items():
            sums.setdefault(name, []).append((value * running).sum())
        sums.setdefault("running", []).append(running.sum())
        running = running & ~(terminated | truncated)
        if not running.any():
            break
    counts = torch.stack(sums["running"]).float()
    return {name: counts if name == "running" else torch.stack(values).float() / counts
            for name, values in sums.items()}


def trace_run(run_dir: str, args: Args) -> dict:
    """One run's trace (call in a child: Genesis keeps a destroyed scene's memory): its script and the lists of
    `trace_episodes`."""
    import importlib

    checkpoint = torch.load(os.path.join(run_dir, "checkpoint.pt"), map_location="cpu", weights_only=True)
    script = importlib.import_module(script_of(checkpoint["args"]).removesuffix(".py"))
    run_args = script.args_from_checkpoint(checkpoint)
    if args.env_kwargs:
        run_args = dataclasses.replace(run_args, env_kwargs={**(run_args.env_kwargs or {}), **args.env_kwargs})
    device = torch.device("cpu")
    vec = script.evaluation_envs(run_args, args.envs, device)  # its evaluation's: first episodes not staggered
    try:
        try:
            script.check_policy_fits_task(vec, checkpoint["obs_normalizer"]["mean"].shape,
                                          checkpoint["model"]["actor_logstd"].shape[-1], "--env-kwargs")
        except script.UsageError as error:
            raise ValueError(str(error)) from None
        policy = script.deployed_policy(run_args, vec, checkpoint, device)
        trace = trace_episodes(policy, vec, args.steps, run_args.seed + script.EVAL_SEED_OFFSET, args.hold_from)
    finally:
        vec.close()
    return {"script": script_of(checkpoint["args"]), "env_id": run_args.env_id, "env_kwargs": run_args.env_kwargs,
            "trace": {name: values.tolist() for name, values in trace.items()}}


def plot(traces: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # every run's terms, in order of first appearance: runs of one task with other weights report other terms
    names = list(dict.fromkeys(name for result in traces.values() for name in result["trace"] if name != "running"))
    rows = (len(names) + 3) // 3  # three panels a row, and one more for the legend
    fig, axes = plt.subplots(rows, 3, figsize=(13, 3.4 * rows), squeeze=False)
    panels = axes.flatten()
    for ax, name in zip(panels, names):
        for index, (run, result) in enumerate(traces.items()):
            if name in result["trace"]:  # the colour stays the run's in every panel
                ax.plot(result["trace"][name], label=run, lw=1.2, color=f"C{index % 10}")
        ax.set_title(name)
        ax.set_xlabel("step of the episode")
        ax.grid(alpha=0.3)
    handles = {label: handle for ax in panels[:len(names)] for handle, label in zip(*ax.get_legend_handles_labels())}
    panels[len(names)].legend(handles.values(), handles.keys(), loc="center", fontsize=7, frameon=False)
    for ax in panels[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: Args) -> str:
    if args.steps < 1 or args.envs < 1:
        raise SystemExit(f"error: --steps {args.steps} --envs {args.envs}: give at least 1 of each")
    run_dirs = [path for pattern in args.run_dirs for path in sorted(glob.glob(pattern)) or [pattern]]
    for run_dir in run_dirs:
        if not os.path.isfile(os.path.join(run_dir, "checkpoint.pt")):
            raise SystemExit(f"error: --run-dirs {run_dir}: no checkpoint.pt there; give a run directory from runs/")
    traces = {}
    for run_dir in run_dirs:
        try:
            traces[os.path.basename(run_dir)] = in_child(trace_run, run_dir, args)
        except ValueError as error:
            raise SystemExit(f"error: --run-dirs {run_dir}: {error}") from None
    lines = [f"Each run's last checkpoint, as deployed (mean action), over the first episodes of {args.envs} "
             "evaluation envs: each reward term (as weighted in the reward) and the action's norm at a step, the mean "
             "over the episodes still running (`python benchmarks/episode_trace.py`)."
             + (f" From step {args.hold_from} on the envs got zeros in place of the policy's action (--hold-from)."
                if args.hold_from is not None else "")]
    for run, result in traces.items():
        trace = result["trace"]
        at = [step for step in args.at if step < len(trace["running"])]
        names = [name for name in trace if name != "running"]
        options = f", options {result['env_kwargs']}" if result["env_kwargs"] else ""
        lines += ["", f"**{run}** ({result['script']}, {result['env_id']}{options})", "",
                  f"| step | {' | '.join(names)} | episodes |", "|---:|" + "---:|" * (len(names) + 1)]
        lines += [f"| {step} | {' | '.join(f'{trace[name][step]:.4g}' for name in names)} | "
                  f"{int(trace['running'][step])} |" for step in at]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(text)
        plot(traces, args.out + ".png")
    print(text)
    return text


if __name__ == "__main__":
    main(tyro.cli(Args))
