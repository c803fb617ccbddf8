"""A strip of frames from an evaluation video, for the results pages: what the policy does, step by step.

    python ppo_continuous.py --eval-checkpoint runs/<run>/checkpoint_best.pt --eval-episodes 2 --capture-video
    python benchmarks/frames.py --video runs/<run>/videos/eval.mp4 --frames 0 12 20 30 49 \
        --out benchmarks/results/franka_cube/frankastackcube_continuous_frames.png

The video is env 0's first evaluation episode (`--capture-video` with `--eval-checkpoint`), one frame per step from
the reset on, so frame k is the scene after step k.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import tyro  # noqa: E402


@dataclass
class Args:
    video: str
    """the MP4 an evaluation wrote (runs/<run>/videos/eval.mp4)"""
    out: str
    """the PNG to write"""
    frames: tuple[int, ...] = (0, 12, 20, 30, 49)
    """which frames, by step of the episode"""
    title: str | None = None
    """a title above the strip (None: the video's path)"""


def main(args: Args) -> str:
    import imageio.v2 as imageio

    video = imageio.mimread(args.video, memtest=False)
    missing = [k for k in args.frames if not 0 <= k < len(video)]
    if missing:
        raise SystemExit(f"--frames {missing} are not in the video ({len(video)} frames, 0-{len(video) - 1})")
    fig, axes = plt.subplots(1, len(args.frames), figsize=(3.2 * len(args.frames), 2.8), squeeze=False)
    for ax, k in zip(axes[0], args.frames):
        ax.imshow(video[k])
        ax.set_title(f"step {k}")
        ax.axis("off")
    fig.suptitle(args.title or args.video)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=100)
    return args.out


if __name__ == "__main__":
    print(main(tyro.cli(Args)))
