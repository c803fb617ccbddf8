"""A trained stacking policy measured step by step: where cube A is while the policy has it on B, and whether letting
go there pays (FrankaStackCube-v0 and FrankaStackCubeRandom-v0).

A policy that puts A on B and never opens the gripper (`released_on_b` 0) either has not found the release or holds A
where letting go would drop it. This runs a checkpoint's policy as deployed (mean action, frozen normaliser, the
memory scripts' memory carried from step to step) for one episode per env and reports, every few steps, for the envs
with A on B: A's offset from B's centre in the plane, the gap between A's bottom and B's top, A's tilt (the smallest
angle between one of its axes and the vertical), A's speed and the gripper action. `--open-after N` then takes over
the gripper in each env once A has been on B for N steps in a row and opens it for the rest of the episode;
`--freeze-arm` also holds the arm's joint targets from then on (zero actions) instead of the policy's. The forced
episodes solved at the end, by A's offset and tilt at the moment of opening, say whether the hold can be let go of;
on the randomised task also by each drawn mass and friction (the lower and the upper half of its range).

    python benchmarks/stack_probe.py --checkpoint runs/FrankaStackCubeRandom-v0__<run>/checkpoint.pt
    python benchmarks/stack_probe.py --checkpoint runs/<run>/checkpoint.pt --open-after 6 --freeze-arm
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import envs  # noqa: E402
from benchmarks.pick_probe import checkpoint_file, deployed_policy  # noqa: E402
from envs.franka_cube import CUBE_HALF_SIZE  # noqa: E402

OFFSET_BINS_M = (0.0, 0.005, 0.01, 0.015, 0.02, 0.05)  # A's distance from B's centre in the plane at the opening
TILT_BINS_DEG = (0.0, 2.0, 4.0, 8.0, 90.0)


@dataclass
class Args:
    checkpoint: str
    """the policy to probe: a checkpoint of any of the three scripts, or a run directory (its checkpoint.pt)"""
    env_id: str | None = None
    """the stacking task to probe it on (default: the one it was trained on, with its --env-kwargs)"""
    num_envs: int = 200
    """episodes, one per env"""
    seed: int = 0
    """the task's seed (the cubes' positions and, on the randomised task, the masses and frictions)"""
    open_after: int = 0
    """open the gripper in an env once A has been on B this many steps in a row, to the episode's end (0: never)"""
    freeze_arm: bool = False
    """with --open-after, also hold the arm's joint targets from the opening on (zero actions), not the policy's"""
    report_every: int = 5
    """print the hold every this many steps"""


def force_release(action: torch.Tensor, on_b_steps: torch.Tensor, opened: torch.Tensor, open_after: int,
                  freeze_arm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The action sent instead of the policy's, and which envs are opened from now on: an env opens once A has been
    on B `open_after` steps in a row (0: never) and stays open, whether A stays on B or not."""
    if open_after > 0:
        opened = opened | (on_b_steps >= open_after)
    action = action.clone()
    action[opened, -1] = 1.0  # the gripper action's top: fully open
    if freeze_arm:
        action[opened, :-1] = 0.0  # joint-position deltas of zero: the arm's targets stay where they are
    return action, opened


def hold_geometry(vec) -> dict[str, torch.Tensor]:
    """Per env: A's offset from B's centre in the plane (m), A's bottom above B's top (m, < 0 pressed in), A's tilt
    (degrees from upright, any face down), A's speed (m/s) and angular speed (rad/s)."""
    offset = vec.cube_pos - vec.cube_b_pos
    w, x, y, z = vec.cube_quat.unbind(-1)
    # The third row of A's rotation matrix: each of A's axes' vertical component; a cube is upright on any face.
    vertical = torch.stack((2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)), -1)
    tilt = torch.rad2deg(torch.acos(vertical.abs().amax(-1).clamp(max=1.0)))
    return {"offset_m": offset[:, :2].norm(dim=-1), "gap_m": offset[:, 2] - 2 * CUBE_HALF_SIZE, "tilt_deg": tilt,
            "speed": vec.cube_vel.norm(dim=-1), "angular_speed": vec.cube_ang.norm(dim=-1)}


def probe(vec, obs: torch.Tensor, act, args: Args) -> dict:
    """The rest of the episode in each env of `vec` (just reset, made with stagger_episodes=False; `obs` its
    observation) under `act(obs) -> action`, the gripper forced open as `args` says. Returns the per-step rows, the
    episodes' end and, when forced, the outcome by A's offset and tilt at the opening."""
    n = vec.num_envs
    on_b_steps = torch.zeros(n, dtype=torch.long)
    opened = torch.zeros(n, dtype=torch.bool)
    at_opening = {key: torch.full((n,), float("nan")) for key in ("offset_m", "tilt_deg")}
    # The randomised task's masses and frictions, drawn at the reset: the last step's autoreset draws the next ones.
    dynamics = {name: vec.dynamics[:, column].cpu().clone()
                for column, name in enumerate(getattr(vec, "dynamics_names", ()))}
    rows = []
    for step in range(vec.max_episode_steps):
        policy_action = act(obs)
        action, now_opened = force_release(policy_action, on_b_steps, opened, args.open_after, args.freeze_arm)
        if args.open_after > 0:
            geometry = hold_geometry(vec)  # where A was when the gripper was first told to open
            for key in at_opening:
                at_opening[key] = torch.where(now_opened & ~opened, geometry[key].cpu(), at_opening[key])
        opened = now_opened
        obs, _, _, truncated, info = vec.step(action)
        if truncated.all():
            break  # the envs are reset: their state is the next episode's
        on_b = (vec.stage >= 2).cpu()
        on_b_steps = torch.where(on_b, on_b_steps + 1, 0)
        if (step + 1) % args.report_every == 0:
            geometry = {key: value[on_b].cpu() for key, value in hold_geometry(vec).items()}
            rows.append({"step": step + 1, "on_b": on_b.float().mean().item(),
                         "solved": (vec.stage == 3).float().mean().item(),
                         **{key: value.mean().item() for key, value in geometry.items()},
                         "gripper_action_on_b": policy_action[on_b, -1].mean().item(),
                         "held_on_b": vec.held[on_b].float().mean().item(), "opened": opened.float().mean().item()})
    metrics = info["episode_metrics"]
    solved = info["success"].bool().cpu()
    result = {"episodes": n, "solved": solved.float().mean().item(),
              "solved_once": metrics["success_once"].float().mean().item(),
              "reached_stacked": metrics["reached_stacked"].float().mean().item(),
              "released_on_b": metrics["released_on_b"].float().mean().item(),
              "opened": opened.float().mean().item(), "rows": rows}
    if args.open_after > 0:
        binned = [(key, at_opening[key], edges) for key, edges in (("offset_m", OFFSET_BINS_M),
                                                                   ("tilt_deg", TILT_BINS_DEG))]
        for column, (name, drawn) in enumerate(dynamics.items()):  # each range's lower and upper half
            low, high = vec.dynamics_low[column].item(), vec.dynamics_high[column].item()
            binned.append((name, drawn, (low, (low + high) / 2, high)))  # drawn in [low, high)
        for key, value, edges in binned:
            result[f"solved_by_{key}"] = []
            for low, high in zip(edges[:-1], edges[1:]):
                chosen = opened & (value >= low) & (value < high)
                result[f"solved_by_{key}"].append({"low": low, "high": high, "episodes": int(chosen.sum()),
                                                   "solved": solved[chosen].float().mean().item()})
    return result


def main(args: Args) -> dict:
    path = checkpoint_file(args.checkpoint)
    if not os.path.isfile(path):
        sys.exit(f"stack_probe.py: --checkpoint {args.checkpoint}: no such checkpoint file or run directory")
    trained = torch.load(path, map_location="cpu", weights_only=True)["args"]
    env_id = args.env_id or trained["env_id"]
    if not env_id.startswith("FrankaStackCube"):
        sys.exit(f"stack_probe.py: {env_id} is not a stacking task: pass --env-id FrankaStackCube-v0 or "
                 "FrankaStackCubeRandom-v0")
    task_kwargs = (trained.get("env_kwargs") or {}) if env_id == trained["env_id"] else {}  # the task as trained
    vec = envs.make(env_id, num_envs=args.num_envs, seed=args.seed, sim_device="cpu",
                    **{**task_kwargs, "stagger_episodes": False})
    policy = deployed_policy(path, vec)
    memory = policy.initial_memory(args.num_envs, torch.device("cpu"))  # one episode per env: never reset

    def act(obs: torch.Tensor) -> torch.Tensor:
        nonlocal memory
        with torch.inference_mode():
            action, *memory = policy(obs, *memory)
        return action

    obs, _ = vec.reset()
    result = probe(vec, obs, act, args)
    vec.close()
    keys = ("on_b", "solved", "offset_m", "gap_m", "tilt_deg", "speed", "angular_speed", "gripper_action_on_b",
            "held_on_b", "opened")
    print("| step | " + " | ".join(keys) + " |\n|---:|" + "---:|" * len(keys))
    for row in result["rows"]:
        print(f"| {row['step']} | " + " | ".join(f"{row[key]:.3f}" for key in keys) + " |")
    for key in [name for name in result if name.startswith("solved_by_")]:
        for entry in result[key]:
            print(f"{key} {entry['low']:g}-{entry['high']:g}: {entry['episodes']} episodes, "
                  f"solved {entry['solved']:.2f}")
    print(json.dumps({key: value for key, value in result.items() if key not in ("rows",)
                      and not key.startswith("solved_by")}))
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
