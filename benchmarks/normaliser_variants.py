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

The statistics are gathered, frozen, saved and clipped at +-10 as without; only the shift or the scale applied to
each observation changes.
"""

from __future__ import annotations

import os
import sys

import torch

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


VARIANTS = {"centre-only": lambda: keep_only("centre"), "scale-only": lambda: keep_only("scale")}

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
