"""Batched continuous-control tasks behind one torch-tensor interface (DESIGN.md §3).

    import envs
    vec = envs.make("FrankaReach-v0", num_envs=256, seed=1, device="cpu")
    obs, info = vec.reset()
    obs, reward, terminated, truncated, info = vec.step(action)   # all torch tensors on `device`

Any Gymnasium id works (MuJoCo, classic control, Box2D), plus the partially observable variants of
`envs.partial` (`PendulumNoVel-v1`, `HalfCheetahNoVel-v5`, `HalfCheetah-P-v5`, ...) and the Genesis
arm tasks `FrankaReach-v0` and `FrankaReachNoVel-v0` (velocities hidden) (`envs.franka`), and the
memory task `MemoryCue-v0` (`envs.memory`). Importing this package registers them with Gymnasium.

Nothing here knows about PPO: observation/reward normalisation and action clipping belong to the scripts.
"""

from __future__ import annotations

import difflib

import gymnasium as gym
import torch

from envs.core import EpisodeTracker, GymnasiumVecEnv
from envs.memory import register as register_memory_tasks
from envs.partial import register_variants

__all__ = ["make", "EpisodeTracker", "GymnasiumVecEnv", "GENESIS_IDS"]

GENESIS_IDS = ("FrankaReach-v0", "FrankaReachNoVel-v0")

register_variants()
register_memory_tasks()
for _id, _kwargs in (("FrankaReach-v0", {}), ("FrankaReachNoVel-v0", {"observe_velocities": False})):
    if _id not in gym.registry:
        gym.register(_id, vector_entry_point="envs.franka:FrankaReachVecEnv", max_episode_steps=100, kwargs=_kwargs)


def make(
    env_id: str,
    num_envs: int = 1,
    seed: int = 0,
    device: str | torch.device = "cpu",
    vectorization_mode: str = "sync",
    **env_kwargs,
):
    """A batch of `num_envs` envs of `env_id` whose tensors live on `device`.

    vectorization_mode: "sync" steps Gymnasium envs in this process, "async" in one subprocess each
    (worth it for many slow envs); natively batched tasks (FrankaReach-v0) ignore it.
    env_kwargs go to the task (for FrankaReach-v0: sim_device="cpu"|"gpu"|"auto", decimation, ...).
    """
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as error:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else "; see README.md for the task list"
        raise ValueError(f"unknown env id {env_id!r} ({error}){hint}") from None
    if spec.vector_entry_point is not None and spec.entry_point is None:
        return gym.make_vec(env_id, num_envs=num_envs, seed=seed, device=device, **env_kwargs)
    return GymnasiumVecEnv(env_id, num_envs, seed, device, vectorization_mode, **env_kwargs)
