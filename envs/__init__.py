"""Batched continuous-control tasks behind one torch-tensor interface (docs/design.md §3).

    import envs
    vec = envs.make("FrankaReach-v0", num_envs=256, seed=1, device="cpu")
    obs, info = vec.reset()
    obs, reward, terminated, truncated, info = vec.step(action)   # all torch tensors on `device`

Any Gymnasium id works (MuJoCo, classic control, Box2D), plus the partially observable variants of
`envs.partial` (`PendulumNoVel-v1`, `HalfCheetahNoVel-v5`, `HalfCheetah-P-v5`, ...) and the Genesis
arm tasks `FrankaReach-v0`, `FrankaReachNoVel-v0` (velocities hidden), `FrankaReachCue-v0` (target seen
only at first) and `FrankaReachDelay-v0` (an unobserved actuation delay) (`envs.franka`), `FrankaPushCube-v0`,
`FrankaPushCubeRandom-v0` (unobserved mass and friction), `FrankaPickCube-v0`, `FrankaStackCube-v0` and
`FrankaStackCubeRandom-v0` (unobserved masses and frictions) (`envs.franka_cube`), the quadruped `Go2Walk-v0`,
`Go2WalkNoVel-v0` (base velocities hidden) and `Go2WalkNoVelAll-v0` (joint velocities too) (`envs.go2`), the same on
rough terrain with a terrain curriculum, `Go2Rough-v0` (a height scan) and `Go2RoughBlind-v0` (none)
(`envs.go2_rough`), and the memory task `MemoryCue-v0` (`envs.memory`). Importing this package registers them with
Gymnasium.

A long-lived process that builds many Genesis scenes calls `envs.release_genesis()` once its envs are closed: Genesis
keeps the native memory of destroyed scenes until it is itself destroyed.

Nothing here knows about PPO: observation/reward normalisation and action clipping belong to the scripts.
"""

from __future__ import annotations

import inspect
import re

import gymnasium as gym
import torch

from envs.core import MAX_ABS_VALUE, EpisodeTracker, GymnasiumVecEnv, torch_device
from envs.genesis import release_genesis
from envs.memory import register as register_memory_tasks
from envs.partial import register_variants

__all__ = ["make", "EpisodeTracker", "GymnasiumVecEnv", "MAX_ABS_VALUE", "UnknownTaskError", "release_genesis"]


class UnknownTaskError(ValueError):
    """An env id that is not registered (the message suggests close matches)."""


register_variants()
register_memory_tasks()
for _id, _entry, _steps, _kwargs in (
    ("FrankaReach-v0", "envs.franka:FrankaReachVecEnv", 100, {}),
    ("FrankaReachNoVel-v0", "envs.franka:FrankaReachVecEnv", 100, {"observe_velocities": False}),
    ("FrankaReachCue-v0", "envs.franka:FrankaReachCueVecEnv", 100, {}),
    ("FrankaReachDelay-v0", "envs.franka:FrankaReachDelayVecEnv", 100, {}),
    ("FrankaPushCube-v0", "envs.franka_cube:FrankaPushCubeVecEnv", 50, {}),
    ("FrankaPushCubeRandom-v0", "envs.franka_cube:FrankaPushCubeVecEnv", 50, {"randomise_dynamics": True}),
    ("FrankaPickCube-v0", "envs.franka_cube:FrankaPickCubeVecEnv", 50, {}),
    ("FrankaStackCube-v0", "envs.franka_cube:FrankaStackCubeVecEnv", 50, {}),
    ("FrankaStackCubeRandom-v0", "envs.franka_cube:FrankaStackCubeVecEnv", 50, {"randomise_dynamics": True}),
):
    if _id not in gym.registry:
        gym.register(_id, vector_entry_point=_entry, max_episode_steps=_steps, kwargs=_kwargs)
for _id, _kwargs in (("Go2Walk-v0", {}), ("Go2WalkNoVel-v0", {"observe_base_velocity": False}),
                     ("Go2WalkNoVelAll-v0", {"observe_base_velocity": False, "observe_joint_velocity": False})):
    if _id not in gym.registry:
        gym.register(_id, vector_entry_point="envs.go2:Go2WalkVecEnv", max_episode_steps=1000, kwargs=_kwargs)
for _id, _kwargs in (("Go2Rough-v0", {}), ("Go2RoughBlind-v0", {"height_scan": False})):
    if _id not in gym.registry:
        gym.register(_id, vector_entry_point="envs.go2_rough:Go2RoughVecEnv", max_episode_steps=1000, kwargs=_kwargs)


def make(
    env_id: str,
    num_envs: int = 1,
    seed: int = 0,
    device: str | torch.device = "cpu",
    vectorization_mode: str = "sync",
    sim_device: str = "auto",
    stagger_episodes: bool = True,
    **env_kwargs,
):
    """A batch of `num_envs` envs of `env_id` whose tensors live on `device`.

    Every task takes every option here, so callers need not know which kind of task they make; each option
    means something to one kind and is ignored by the other:
    vectorization_mode: "sync" steps Gymnasium envs in this process, "async" in one subprocess each
    (worth it for many slow envs); natively batched tasks (FrankaReach-v0) ignore it.
    sim_device: where a natively batched (Genesis) task simulates: "cpu", "gpu" (or "cuda"), "auto" (the GPU when
    torch sees one); Gymnasium tasks always step on the CPU.
    stagger_episodes: natively batched tasks spread their first episodes' lengths (decorrelated batches for
    training; evaluation turns it off); Gymnasium envs are not staggered.
    env_kwargs go to the task (for FrankaReach-v0: decimation, ...).
    """
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    torch_device(device)
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as error:  # Gymnasium's message suggests close names ("Did you mean: ...")
        raise UnknownTaskError(f"unknown env id {env_id!r}: {error}; docs/tasks.md lists the tasks") from None
    natively_batched = spec.vector_entry_point is not None and spec.entry_point is None
    defaults = task_defaults(spec) if env_kwargs else {}
    for name, value in env_kwargs.items():  # a typo'd value, before the task computes with it (a traceback there)
        default = defaults.get(name)
        if isinstance(value, str) and isinstance(default, (int, float)) and not isinstance(default, bool):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if isinstance(value, str) and isinstance(default, tuple):
            raise ValueError(f"{name} must be {len(default)} numbers (one word on the command line: "
                             f"{','.join(map(str, default))}), got {value!r}")
    try:
        if natively_batched:
            return gym.make_vec(env_id, num_envs=num_envs, seed=seed, device=device, sim_device=sim_device,
                                stagger_episodes=stagger_episodes, **env_kwargs)
        return GymnasiumVecEnv(env_id, num_envs, seed, device, vectorization_mode, **env_kwargs)
    except TypeError as error:
        unknown = re.search(r"unexpected keyword argument '([^']+)'", str(error))
        if unknown is None:
            raise
        raise ValueError(f"{env_id} has no option {unknown.group(1)!r}; its options are: "
                         f"{', '.join(sorted(defaults))}") from None


def task_defaults(spec) -> dict:
    """The keyword arguments a registered task accepts, each with its default (inspect.Parameter.empty if none)."""
    if "base_id" in spec.kwargs:  # a partially observable variant: the options of its base task
        return task_defaults(gym.spec(spec.kwargs["base_id"]))
    natively_batched = spec.entry_point is None
    entry = spec.vector_entry_point if natively_batched else spec.entry_point
    creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    # A task class that passes **kwargs on to its parent (FrankaReachCue-v0) takes its parents' options too.
    creators = [c.__init__ for c in creator.__mro__ if "__init__" in vars(c)] if inspect.isclass(creator) else [creator]
    defaults = {}
    for function in creators:
        parameters = inspect.signature(function).parameters.values()
        for p in parameters:
            if (p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                    and p.name not in ("self", "num_envs", "seed", "device") and p.name not in spec.kwargs):
                defaults.setdefault(p.name, p.default)  # a subclass's own default first
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    if not natively_batched:  # what gym.make and the batch adapter add
        defaults.update(max_episode_steps=None, render_mode=None, max_abs_value=MAX_ABS_VALUE)
    return defaults
