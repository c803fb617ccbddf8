"""ppo_continuous.py with one thing changed about `--privileged-critic`, to find out why that flag delayed the lift on
FrankaStackCubeRandom-v0 by millions of steps where the same critic reading constants (the draws narrowed to the fixed
task's values by --env-kwargs) did not (benchmarks/results/franka_cube/README.md). The first word names the change; the
rest are ppo_continuous.py's flags, all of them (resume and evaluation too):

    python benchmarks/privileged_critic_variants.py noise --env-id FrankaStackCubeRandom-v0 --privileged-critic ...

noise      the cube tasks draw their masses and frictions per episode as before (the critic reads them) but never send
           them to the simulator, which keeps the fixed task's: numbers that tell one episode from another and say
           nothing about it (with 50-step episodes over 24-step rollouts, the critic is fitted to an episode's first
           steps before the advantages of its next ones are computed).
zero-init  the critic's first-layer weights on its observation's privileged part (past the policy's observation) start
           at zero, so that its value starts independent of them (the same random draws: the actor's weights as
           without); with raw inputs, the initial weights turn each episode's draws into a value offset of its own.
masses-only, frictions-only
           the simulator gets every draw as without, the critic reads only the drawn masses (or only the frictions):
           the other columns of its observation hold the middle of their ranges, in every episode.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_continuous  # noqa: E402
from benchmarks import choose_variant  # noqa: E402
from envs.franka_cube import FrankaCubeVecEnv  # noqa: E402


def keep_dynamics_fixed() -> None:
    """noise: the cube tasks still draw their masses and frictions (the critic observation holds them) and no longer
    send them to the simulator, which keeps the scene's own."""
    FrankaCubeVecEnv._send_dynamics = lambda self, envs_idx: None


def zero_privileged_weights() -> None:
    """zero-init: the critic's first-layer weights on the critic observation's columns past the policy's, zero."""
    build = ppo_continuous.Agent.__init__

    def build_then_zero(agent, args, obs_space, action_space, critic_obs_space=None):
        build(agent, args, obs_space, action_space, critic_obs_space)
        if critic_obs_space is not None:
            with torch.no_grad():
                agent.critic[0].weight[:, obs_space.shape[0]:] = 0.0

    ppo_continuous.Agent.__init__ = build_then_zero


def critic_reads_only(quantity: str) -> None:
    """masses-only, frictions-only: the critic observation's drawn quantities other than `quantity` ("mass" or
    "friction") replaced by the middle of their ranges; the draws still reach the simulator."""

    hidden_columns = {}  # per env, made once: no host-to-device copy per step

    def observe_critic(env) -> torch.Tensor:
        if env not in hidden_columns:
            hidden_columns[env] = torch.tensor([not name.endswith("_" + quantity) for name in env.dynamics_names],
                                               device=env.dynamics.device)
        middle = (env.dynamics_low + env.dynamics_high) / 2
        return torch.cat([env._observe(), torch.where(hidden_columns[env], middle, env.dynamics)], dim=-1)

    FrankaCubeVecEnv._observe_critic = observe_critic


VARIANTS = {"noise": keep_dynamics_fixed, "zero-init": zero_privileged_weights,
            "masses-only": lambda: critic_reads_only("mass"), "frictions-only": lambda: critic_reads_only("friction")}

if __name__ == "__main__":
    VARIANTS[choose_variant(VARIANTS, __doc__, ppo_continuous)]()
    ppo_continuous.cli()
