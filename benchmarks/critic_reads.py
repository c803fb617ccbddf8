"""How much a privileged critic's value rests on the privileged part of its observation, checkpoint by checkpoint of
ppo_continuous.py runs with `--privileged-critic`: no envs, only what each checkpoint holds.

Each checkpoint keeps the critic observations its envs were at when it was written (one per env). For those, the
critic's value is compared with its value when the privileged columns (past the policy's observation) are all set to
the same numbers, `--reference` (default: their mean over the envs): the spread of that difference over the envs is how
much one episode's privileged numbers move its value away from another's. Also the norms of the critic's first-layer
weights per input column, the privileged ones and the mean of the policy's (with raw inputs, what the network can make
of a column). For a task whose privileged numbers are constant per episode (drawn masses and frictions), a spread
that stays at its initial size says the critic has not learnt to use them, one that grows that it has.

A column's norm can grow without the critic reading it: a column that is the same in every env (a quantity held
constant) gets the first-layer bias's gradient times that constant, and under Adam moves with the bias. So each
privileged column's weights are also compared with the run's first checkpoint read: the norm of their change since,
less its part along the bias's change. That is zero for a column that moved only as a bias, but not for a column of
noise, whose weights wander: read it beside a run whose drawn columns mean nothing
(`benchmarks/privileged_critic_variants.py noise`).

    python benchmarks/critic_reads.py --run-dirs runs/FrankaStackCubeRandom-v0__stackrandom_priv__1__<time> --every 4
"""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import dataclass

import gymnasium as gym
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_continuous  # noqa: E402


@dataclass
class Args:
    run_dirs: tuple[str, ...]
    """ppo_continuous.py run directories whose numbered checkpoints (checkpoint_000010.pt, ...) to read"""
    every: int = 1
    """read every this many of a run's numbered checkpoints (the first always)"""
    reference: tuple[float, ...] | None = None
    """the privileged columns' common values (default: their mean over the checkpoint's envs)"""


def privileged_reliance(checkpoint: dict, reference: torch.Tensor | None = None) -> dict:
    """For one checkpoint: the step, the std over its envs of value(critic obs) - value(the privileged columns set to
    `reference`, default their mean), the std of the values themselves, the critic's first-layer column norms (the
    policy's columns' mean, then each privileged column's), and its first-layer privileged columns and bias."""
    args = ppo_continuous.args_from_checkpoint(checkpoint)
    critic_obs = checkpoint.get("next_critic_obs_raw")
    if critic_obs is None:
        raise ValueError("the checkpoint has no critic observation: a run without --privileged-critic, or a task "
                         "without a critic observation")
    critic_obs = critic_obs.float().cpu()
    model = checkpoint["model"]
    obs_dim, act_dim = model["actor_mean.0.weight"].shape[1], model["actor_logstd"].shape[-1]
    box = lambda n: gym.spaces.Box(-1.0, 1.0, (n,))  # noqa: E731 (only the shapes matter; the bounds are loaded)
    agent = ppo_continuous.Agent(args, box(obs_dim), box(act_dim), box(critic_obs.shape[1]))
    agent.load_state_dict(model)
    normaliser = ppo_continuous.ObsNormalizer(critic_obs.shape[1:], args.norm_obs, args.norm_obs_until,
                                              args.norm_obs_eps)
    normaliser.load_state_dict(checkpoint["critic_obs_normalizer"])
    if reference is not None and len(reference) != critic_obs.shape[1] - obs_dim:
        raise ValueError(f"--reference has {len(reference)} values; the critic observation has "
                         f"{critic_obs.shape[1] - obs_dim} privileged columns")
    common = critic_obs.clone()
    common[:, obs_dim:] = critic_obs[:, obs_dim:].mean(0) if reference is None else reference
    with torch.no_grad():
        value, value_common = agent.get_value(normaliser(critic_obs)), agent.get_value(normaliser(common))
    first_layer = agent.critic[0]
    weight_norms = first_layer.weight.detach().norm(dim=0)
    return {"global_step": checkpoint["global_step"], "offset_std": (value - value_common).std().item(),
            "value_std": value.std().item(), "policy_columns": weight_norms[:obs_dim].mean().item(),
            "privileged_columns": weight_norms[obs_dim:].tolist(),
            "privileged_weights": first_layer.weight.detach()[:, obs_dim:].clone(),
            "bias": first_layer.bias.detach().clone()}


def moved_off_bias(first: dict, later: dict) -> list[float]:
    """Per privileged column, the norm of its first-layer weights' change from `first` to `later` (two rows of one
    run) less the change's projection on the bias's change: a column constant over the envs moves only along it."""
    bias_change = later["bias"] - first["bias"]
    change = later["privileged_weights"] - first["privileged_weights"]
    if bias_change.norm() > 0:
        direction = bias_change / bias_change.norm()
        change = change - direction[:, None] * (direction @ change)[None, :]
    return change.norm(dim=0).tolist()


def main(args: Args) -> dict[str, list[dict]]:
    if args.every < 1:
        raise SystemExit(f"error: --every {args.every}: read every N-th checkpoint, N >= 1")
    reference = None if args.reference is None else torch.tensor(args.reference)
    rows = {}
    for run_dir in args.run_dirs:
        paths = sorted(glob.glob(os.path.join(run_dir, "checkpoint_[0-9]*.pt")))[::args.every]
        if not paths:
            raise SystemExit(f"error: --run-dirs {run_dir}: no numbered checkpoints (checkpoint_000010.pt, ...)")
        try:
            rows[run_dir] = [privileged_reliance(torch.load(p, map_location="cpu", weights_only=False), reference)
                             for p in paths]
        except ValueError as error:
            raise SystemExit(f"error: --run-dirs {run_dir}: {error}") from None
        print(os.path.basename(run_dir.rstrip("/")))
        print(f"  {'step':>10} {'offset std':>10} {'value std':>9}  first-layer column norms: policy mean | privileged"
              " | privileged moved since the first row, off the bias")
        for row in rows[run_dir]:
            row["moved_off_bias"] = moved_off_bias(rows[run_dir][0], row)
            print(f"  {row['global_step']:>10,} {row['offset_std']:>10.3f} {row['value_std']:>9.3f}  "
                  f"{row['policy_columns']:.2f} | {' '.join(f'{n:.2f}' for n in row['privileged_columns'])} | "
                  f"{' '.join(f'{n:.2f}' for n in row['moved_off_bias'])}")
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
