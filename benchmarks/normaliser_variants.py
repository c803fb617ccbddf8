"""ppo_continuous.py with the observation normaliser doing part of its work, to find out which part holds picking's
normalised seeds on the table (benchmarks/results/franka_cube/README.md): neither the clip, the scale, the update
size nor the running mean's drift did. The first word names the variant; the rest are ppo_continuous.py's flags, all
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
centre-imposed
             the converse: raw observations (neither shifted nor scaled), and whenever the running mean moves by d
             those first layers subtract W d from their bias: the networks compute what centre-only's would, while
             the first layer's weights learn from raw x.

The centring's two parts, then: the function the networks start from and the first layer's gradient. On a seed, raw
observations have both raw, centre-only both centred, centre-absorbed the raw start and the centred gradient,
centre-imposed the converse.

The statistics are gathered, frozen, saved and clipped at +-10 as without (the last variant clips raw observations);
only the shift or the scale applied to each observation changes, and for the last two the first layers' biases.
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


def keep(centre: bool, scale: bool) -> None:
    """The normaliser's shift (the running mean) and scale (one over the std) each kept or set to the identity's,
    whenever the statistics change."""

    @torch.no_grad()
    def refresh(normaliser) -> None:
        statistics_refresh(normaliser)
        if not centre:
            normaliser.shift.zero_()
        if not scale:
            normaliser.scale.fill_(1.0)

    ppo_continuous.ObsNormalizer.refresh = refresh


statistics_update = ppo_continuous.ObsNormalizer.update
agent_built = ppo_continuous.build_agent


def centring_through_the_biases(centred_inputs: bool) -> None:
    """Every change d of the running mean moved through the first layers' biases (each normaliser learns which layers
    read it when the agent is built): +W d on centred inputs (the raw networks' function), -W d on raw ones (the
    centred networks'). Done where the statistics are gathered, not in `refresh`: a checkpoint's biases already hold
    the mean its statistics load with."""
    keep(centre=centred_inputs, scale=False)
    sign = 1.0 if centred_inputs else -1.0

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
        mean_before = normaliser.mean.clone()
        statistics_update(normaliser, x)
        for layer in getattr(normaliser, "readers", ()):
            layer.bias.add_(layer.weight @ (normaliser.mean - mean_before).float(), alpha=sign)

    ppo_continuous.build_agent = build_agent
    ppo_continuous.ObsNormalizer.update = update


VARIANTS = {"centre-only": lambda: keep(centre=True, scale=False), "scale-only": lambda: keep(centre=False, scale=True),
           "centre-absorbed": lambda: centring_through_the_biases(centred_inputs=True),
           "centre-imposed": lambda: centring_through_the_biases(centred_inputs=False)}

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
