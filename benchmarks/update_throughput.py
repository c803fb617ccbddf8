"""The PPO update alone: seconds per `update()` of each script on a synthetic rollout of its preset's shape.

    python benchmarks/update_throughput.py --env-id FrankaReach-v0 \
        --scripts ppo_continuous ppo_recurrent ppo_transformer
    python benchmarks/update_throughput.py --env-id HalfCheetah-v5 --repeats 4

Each script's `update()` (its epochs of minibatch steps, optimizer and all) runs on one batch of random
observations and actions with log-probabilities and values from the untrained policy, shaped as the task's preset
(num_envs x num_steps, epochs, minibatches, networks), with the update's own thread count (--update-threads).
Episode starts fall every `--episode-length` steps, staggered over envs, as in a Genesis rollout. No simulator, so
a change to the update is measured without the rollout's noise around it; alternate A and B in one sitting and read
the median. Prints a Markdown table (and appends it to --out if given).
"""

from __future__ import annotations

import importlib
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import gymnasium as gym
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import envs  # noqa: E402,F401  (registers the tasks)


@dataclass
class Args:
    env_id: str = "FrankaReach-v0"
    """the task whose preset shapes the batch"""
    scripts: list[str] = field(default_factory=lambda: ["ppo_continuous"])
    """training scripts to measure (module names)"""
    overrides: dict[str, int] = field(default_factory=dict)
    """preset fields to change, e.g. --overrides num_envs 256 update_epochs 5"""
    repeats: int = 8
    """timed updates per script (after one untimed)"""
    episode_length: int = 100
    """steps between episode starts in the synthetic rollout"""
    out: str | None = None
    """append the table to this Markdown file"""


def task_spaces(env_id: str) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """The task's observation and action spaces, from one env (a Genesis task builds a one-env scene)."""
    vec = envs.make(env_id, num_envs=1)
    spaces = vec.single_observation_space, vec.single_action_space
    vec.close()
    return spaces


def synthetic_update(module, args, obs_space, action_space, episode_length: int):
    """A no-argument call of the script's `update()` on one synthetic rollout (agent and optimizer made here)."""
    T, N = args.num_steps, args.num_envs
    obs = torch.randn(T, N, obs_space.shape[0])
    actions = torch.randn(T, N, action_space.shape[0])
    starts = (torch.arange(T)[:, None] + torch.randint(0, episode_length, (N,))) % episode_length == 0
    advantages, returns = torch.randn(T, N), torch.randn(T, N)
    if hasattr(module, "RecurrentAgent"):
        agent = module.RecurrentAgent(args, obs_space, action_space)
        state_buf = torch.zeros(T, N, agent.state_size)
        with torch.no_grad():
            _, logprobs, _, values, _ = agent.get_action_and_value(obs, state_buf[0], starts, actions)
        optimizer = module.make_optimizer(agent, args)
        batch = (obs, starts, actions, logprobs, values, advantages, returns, None)  # no critic observation
        return lambda: module.update(agent, optimizer, module.ppo_loss, batch, state_buf, args)
    if hasattr(module, "TransformerAgent"):
        agent = module.TransformerAgent(args, obs_space, action_space)
        # every step's window of K observations, all valid: attention costs the same whatever the mask
        K, P = args.context_len, args.memory_tokens
        windows = torch.randn(T, N, K, obs_space.shape[0])
        valid = torch.ones(T, N, K, dtype=torch.bool)
        # memory mode: the memory carried into each step, and episode starts where it is reset
        memory = torch.randn(T, N, P, args.token_dim) if P else None
        starts = starts if P else None
        with torch.no_grad():
            _, logprobs, _, values = agent.get_action_and_value(windows, valid, actions, None,
                                                                None if memory is None else memory[0], starts)[:4]
        optimizer = module.make_optimizer(agent, args)
        batch = (windows, valid, starts, actions, logprobs, advantages, returns, values, None)
        return lambda: module.update(agent, optimizer, module.ppo_loss, batch, memory, args)
    agent = module.Agent(args, obs_space, action_space)
    flat_obs, flat_actions = obs.flatten(0, 1), actions.flatten(0, 1)
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(flat_obs, flat_actions)
    optimizer = module.make_optimizer(agent, args)
    batch = (flat_obs, flat_actions, logprobs, advantages.flatten(), returns.flatten(), values, None)  # no critic obs
    return lambda: module.update(agent, optimizer, module.ppo_loss, batch, args)


def measure(script: str, args: Args, obs_space, action_space) -> dict:
    module = importlib.import_module(script)
    train_args = module.resolve_args(module.task_args(args.env_id, **args.overrides))
    threads = torch.get_num_threads()
    torch.set_num_threads(train_args.update_threads or threads)
    try:
        torch.manual_seed(0)
        run_update = synthetic_update(module, train_args, obs_space, action_space, args.episode_length)
        run_update()  # warm-up: allocations, the first kernel launches
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run_update()
            seconds.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    minibatches = train_args.update_epochs * train_args.num_minibatches
    return {"script": script, "batch": f"{train_args.num_envs} x {train_args.num_steps}", "minibatches": minibatches,
            "median_s": statistics.median(seconds), "min_s": min(seconds)}


def main(args: Args) -> str:
    obs_space, action_space = task_spaces(args.env_id)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    rows = [f"`update()` alone on {args.env_id}'s preset batch ({machine}):", "",
            "| script | num_envs x num_steps | minibatch steps | median s per update | min s | ms per minibatch |",
            "|---|---:|---:|---:|---:|---:|"]
    for script in args.scripts:
        r = measure(script, args, obs_space, action_space)
        rows.append(f"| {script}.py | {r['batch']} | {r['minibatches']} | {r['median_s']:.3f} | {r['min_s']:.3f} "
                    f"| {1000 * r['median_s'] / r['minibatches']:.1f} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows) + "\n"
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n")
    return table


if __name__ == "__main__":
    main(tyro.cli(Args))
