"""Partially observable variants of Gymnasium tasks, for memory (recurrent, transformer) experiments.

Two kinds, registered in Gymnasium's registry so `gym.make`, `gym.make_vec` and `envs.make` all work:

- `...NoVel`: every velocity entry is removed (joint velocities, and for Humanoid the body velocities
  `cvel`); everything else stays. A memoryless policy must act on positions alone, so an agent has to
  infer velocity from its recent observations.
- `...-P` (position-only, as in Ni et al. 2022, "Recurrent Model-Free RL Can Be a Strong Baseline for
  Many POMDPs"): only the joint-position block `qpos` stays. For HalfCheetah, Hopper, Walker2d, Swimmer and
  InvertedPendulum, whose observation is just positions then velocities, this equals NoVel; for Ant and
  Humanoid it also drops contact forces and body inertias, and for InvertedDoublePendulum the constraint force.

Each variant's critic observation (docs/design.md §3) is the base task's whole observation.

`VELOCITY_INDICES` and `POSITION_INDICES` below are the documentation: indices into the full observation
of the base task (checked against the simulator state in tests/test_envs.py).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

# base id: (observation size, indices of velocity entries, indices of the qpos block)
_LAYOUTS: dict[str, tuple[int, list[int], list[int]]] = {
    # classic control: Pendulum obs = [cos θ, sin θ, θ̇]; MountainCarContinuous obs = [position, velocity]
    "Pendulum-v1": (3, [2], [0, 1]),
    "MountainCarContinuous-v0": (2, [1], [0]),
    # MuJoCo v5: qpos (root x, and y for Ant/Humanoid, excluded) then qvel
    "HalfCheetah-v5": (17, list(range(8, 17)), list(range(0, 8))),
    "Hopper-v5": (11, list(range(5, 11)), list(range(0, 5))),
    "Walker2d-v5": (17, list(range(8, 17)), list(range(0, 8))),
    "Swimmer-v5": (8, list(range(3, 8)), list(range(0, 3))),
    "InvertedPendulum-v5": (4, [2, 3], [0, 1]),
    # [x, sin θ1, sin θ2, cos θ1, cos θ2, qvel(3), qfrc_constraint(1)]
    "InvertedDoublePendulum-v5": (9, [5, 6, 7], list(range(0, 5))),
    # qpos[2:] (13), qvel (14), cfrc_ext (78)
    "Ant-v5": (105, list(range(13, 27)), list(range(0, 13))),
    # qpos[2:] (22), qvel (23), cinert (130), cvel (78), qfrc_actuator (17), cfrc_ext (78)
    "Humanoid-v5": (348, list(range(22, 45)) + list(range(175, 253)), list(range(0, 22))),
}

VELOCITY_INDICES = {base: velocity for base, (_, velocity, _) in _LAYOUTS.items()}
POSITION_INDICES = {base: positions for base, (_, _, positions) in _LAYOUTS.items() if base.endswith("-v5")}


def _variant_id(base_id: str, tag: str) -> str:
    name, version = base_id.rsplit("-", 1)
    return f"{name}{tag}-{version}"


def variants():
    """Yields (variant id, base id, indices of the base observation the variant keeps)."""
    for base, (size, velocity, positions) in _LAYOUTS.items():
        yield _variant_id(base, "NoVel"), base, [i for i in range(size) if i not in set(velocity)]
        if base in POSITION_INDICES:
            yield _variant_id(base, "-P"), base, positions


class HideEntries(gym.ObservationWrapper):
    """The base task's observation cut to the entries in `keep` (in order). The whole observation stays available
    to a critic: `info["critic_obs"]` after every reset and step, described by `critic_observation_space`."""

    def __init__(self, env: gym.Env, keep):
        super().__init__(env)
        self.keep = np.asarray(keep, dtype=np.int64)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[self.keep], space.high[self.keep], dtype=space.dtype)
        self.critic_observation_space = space

    # The base task's info dict is a fresh one at every call: adding to it copies nothing (a hot path at one env).
    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        info["critic_obs"] = obs
        return self.observation(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["critic_obs"] = obs
        return self.observation(obs), reward, terminated, truncated, info

    def observation(self, observation):
        return observation[self.keep]


def make_variant(base_id: str, keep, **kwargs) -> gym.Env:
    """Gymnasium entry point of every variant: the base task with a fixed observation subset (in order)."""
    return HideEntries(gym.make(base_id, **kwargs), keep)


def register_variants() -> None:
    for variant_id, base, keep in variants():
        if variant_id not in gym.registry:
            gym.register(variant_id, entry_point="envs.partial:make_variant", kwargs={"base_id": base, "keep": keep})
