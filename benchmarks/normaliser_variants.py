"""ppo_continuous.py with the observation normaliser doing half its work, to find out which half holds picking's
normalised seeds on the table (benchmarks/results/franka_cube/README.md): neither the clip, the scale, the update
size nor the running mean's drift did. The first word names the half kept; the rest are ppo_continuous.py's flags, all
of them, `--norm-obs` among them (resume and evaluation too, with the same first word: the checkpoint holds the
statistics, not the variant):

    python benchmarks/normaliser_variants.py centre-only --env-id FrankaPickCube-v0 --norm-obs \\
        --norm-obs-until 500000 ...

centre-only  each feature minus its running mean, not divided by its std: with `--norm-obs-until` the policy then
             reads raw observations shifted by a constant (what a first layer's bias could absorb), so a run that
             differs from raw observations' differs by the centring alone. `--norm-obs-eps` has no effect.
scale-only   each feature divided by its running std (plus `--norm-obs-eps`), not centred. Give it a floor: with
             `--norm-obs-eps 0` a feature whose mean is ten of its stds from zero (a resting cube's height, 0.02 m
             against 2 mm) sits at the clip. Picking's runs took 1.0, about raw observations' scale.
centre-absorbed
             centre-only, and whenever the running mean moves by d the first layer of each network that reads these
             observations adds W d to its bias: the networks compute what they would on raw observations, at
             initialisation (the same weights as a raw run of the same seed) and through every change of the
             statistics. What differs from raw observations is the first layer's gradient alone (its weights learn
             from x - mean, not x); what differs from centre-only is the function the networks start from.

The statistics are gathered, frozen, saved and clipped at +-10 as without; only the shift or the scale applied to
each observation changes.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_continuous  # noqa: E402
from benchmarks import choose_variant  # noqa: E402

statistics_refresh = ppo_continuous.ObsNormalizer.refresh


def keep_only(half: str) -> None:
    """The normaliser's shift (the running mean) or its scale (one over the std) set to the identity's, whenever the
    statistics change: "centre" keeps the shift, "scale" keeps the scale."""

    @torch.no_grad()
    def refresh(normaliser) -> None:
        statistics_refresh(normaliser)
        if half == "centre":
            normaliser.scale.fill_(1.0)
        else:
            normaliser.shift.zero_()

    ppo_continuous.ObsNormalizer.refresh = refresh


statistics_update = ppo_continuous.ObsNormalizer.update
agent_built = ppo_continuous.build_agent


def absorb_the_centring() -> None:
    """centre-only, with the shift's every change added back through the first layers' biases (each normaliser
    learns which layers read it when the agent is built). Done where the statistics are gathered, not in `refresh`:
    a checkpoint's biases already hold the shift its statistics load with."""
    keep_only("centre")

    def build_agent(args, vec, device, critic_shape=None):
        agent, obs_norm, critic_norm = agent_built(args, vec, device, critic_shape)
        actor_in, critic_in = (next(m for m in network if isinstance(m, nn.Linear))
                               for network in (agent.actor_mean, agent.critic))
        if critic_norm is None:
            obs_norm.readers = [actor_in, critic_in]
        else:  # --privileged-critic: the critic reads its own observation, through its own normaliser
            obs_norm.readers, critic_norm.readers = [actor_in], [critic_in]
        return agent, obs_norm, critic_norm

    @torch.no_grad()
    def update(normaliser, x: torch.Tensor) -> None:
        shift_before = normaliser.shift.clone()
        statistics_update(normaliser, x)
        for layer in getattr(normaliser, "readers", ()):
            layer.bias.add_(layer.weight @ (normaliser.shift - shift_before))

    ppo_continuous.build_agent = build_agent
    ppo_continuous.ObsNormalizer.update = update


VARIANTS = {"centre-only": lambda: keep_only("centre"), "scale-only": lambda: keep_only("scale"),
            "centre-absorbed": absorb_the_centring}

if __name__ == "__main__":
    variant = choose_variant(VARIANTS, __doc__, ppo_continuous)
    from_checkpoint = any(flag.split("=", 1)[0] in ("--resume", "--eval-checkpoint", "--export-checkpoint")
                          for flag in sys.argv[1:])
    if not from_checkpoint and not ppo_continuous.parse_args(sys.argv[1:]).norm_obs:
        print(f"error: {variant} changes the observation normaliser, which this task's preset leaves off: add "
              "--norm-obs", file=sys.stderr)
        raise SystemExit(2)
    VARIANTS[variant]()
    ppo_continuous.cli()
