"""A minimal memory task: what the agent must remember is shown once, then hidden.

`MemoryCue-v0`: at the first step of an episode the observation shows a random sign s in {-1, +1}; from
then on it shows 0 (plus the elapsed fraction of the episode). Every step after the first is rewarded
-(a - s)^2 for the action a in [-1, 1]. A memoryless policy can do no better than a = 0, an expected return
of -(length - 1) (-7 for the default 8 steps); a policy that remembers s reaches 0. Cheap enough to compare
memory architectures over several seeds in minutes (bsuite's memory_length, in continuous form).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class MemoryCueEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 8):
        if length < 2:
            raise ValueError(f"length must be at least 2 (one step to see the cue, one to act on it), got {length}")
        self.length = length
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._t, self._sign = 0, 1.0

    def _obs(self) -> np.ndarray:
        return np.array([self._sign if self._t == 0 else 0.0, self._t / self.length], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._sign = 0, float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action):
        a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        reward = 0.0 if self._t == 0 else -((a - self._sign) ** 2)
        self._t += 1
        return self._obs(), reward, False, False, {}


def register() -> None:
    if "MemoryCue-v0" not in gym.registry:
        gym.register("MemoryCue-v0", entry_point="envs.memory:MemoryCueEnv", max_episode_steps=8)
