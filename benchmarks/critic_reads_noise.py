"""ppo_continuous.py on a cube task whose drawn masses and frictions are never sent to the simulator: the task keeps
the fixed task's dynamics, and a privileged critic reads per-episode numbers drawn as the randomised task draws them
but meaning nothing (the policy does not see them, as always).

The question it answers (benchmarks/results/franka_cube/README.md): `--privileged-critic` on FrankaStackCubeRandom-v0
delayed the lift by millions of steps where the same critic reading constants did not. Do the draws slow learning
through what they say about the dynamics, or as numbers that tell one episode from another (with 50-step episodes
over 24-step rollouts, the critic is fitted to an episode's first steps before the advantages of its next ones)?
Flags are ppo_continuous.py's, all of them (resume, evaluation too):

    python benchmarks/critic_reads_noise.py --env-id FrankaStackCubeRandom-v0 --privileged-critic --exp-name X
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_continuous  # noqa: E402
from envs.franka_cube import FrankaCubeVecEnv  # noqa: E402


def keep_dynamics_fixed() -> None:
    """The cube tasks draw their masses and frictions as before (the critic observation holds them) and no longer
    send them to the simulator, which keeps the scene's own: the fixed task's."""
    FrankaCubeVecEnv._send_dynamics = lambda self, envs_idx: None


if __name__ == "__main__":
    keep_dynamics_fixed()
    ppo_continuous.cli()
