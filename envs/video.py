"""Video of env 0: records its next whole episode to an MP4 (headless; any env with render_mode="rgb_array")."""

from __future__ import annotations

import os

import numpy as np


def write_video(frames: list[np.ndarray], path: str, fps: float = 30) -> str:
    import imageio.v2 as imageio

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    return path


class EpisodeRecorder:
    """`start()` asks for a video; recording begins when env 0's current episode ends and stops at the end of
    the next one, so every video is one whole episode. Call `step(vec, done, path)` after each batch step:
    it only syncs with the device while a video is asked for or running."""

    def __init__(self, fps: float = 30):
        self.fps, self.pending, self.frames = fps, False, None

    def start(self, vec=None) -> None:
        """With `vec` (just reset): record from now on, so the video is env 0's current episode."""
        if vec is not None:
            self.pending, self.frames = False, [vec.render()]
        elif self.frames is None:
            self.pending = True

    def step(self, vec, done, path: str) -> str | None:
        """Returns the path of a video it just wrote, else None."""
        if self.frames is not None:
            self.frames.append(vec.render())
            if bool(done[0]):
                frames, self.frames = self.frames, None
                return write_video(frames, path, self.fps)
        elif self.pending and bool(done[0]):
            self.pending, self.frames = False, []
        return None
