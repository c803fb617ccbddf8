"""FrankaPickCube-v0 measured stage by stage, under a scripted pick-and-place or a trained policy: can the arm, with
the task's gains and actions, grasp the cube, carry it to the goal and be counted a success, does the reward rise
along the way, and where does a trained policy stop?

No learning: Genesis's inverse kinematics gives the joint positions that put the fingertips' centre (the TCP)
where each phase wants it (above the cube, at the cube, at the goal, gripper pointing down), and the action is the
step towards them that the task's joint-delta actions allow (at most `action_scale` rad per joint per step). The
phases, in the 50-step episode: over the cube (gripper open), down to it, close, carry to the goal. Reported per
phase: how often the task counts the cube grasped, the cube's distance to the goal, each reward term, and success at
the end. `--finger-kp` changes the fingers' position gain (the task's is 100 N/m), `--carry-speed` caps the TCP's
speed while carrying (m per step). `--checkpoint` runs a checkpoint's policy as deployed (mean action, frozen
normaliser, the memory scripts' memory carried from step to step), by the script that wrote it, instead of the script.

    python benchmarks/pick_probe.py --num-envs 64 --phases 10 24 30
    python benchmarks/pick_probe.py --num-envs 64 --finger-kp 1000
    python benchmarks/pick_probe.py --num-envs 64 --checkpoint runs/FrankaPickCube-v0__<run>/checkpoint_best.pt
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import envs  # noqa: E402
from envs.franka import NUM_ARM_JOINTS, TCP_OFFSET  # noqa: E402


@dataclass
class Args:
    num_envs: int = 64
    """episodes, one per env"""
    seed: int = 0
    """the task's seed (cube and goal positions)"""
    finger_kp: float = 100.0
    """the fingers' position gain in N/m (the task's: 100)"""
    carry_speed: float = 1.0
    """the most the carrying phase moves the TCP's target per step (m); 1: straight to the goal"""
    phases: tuple[int, int, int] = (10, 24, 30)
    """the steps at which the descent, the closing and the carrying start"""
    checkpoint: str | None = None
    """act with this checkpoint's deployed policy (any of the three scripts') instead of the script"""


def checkpoint_file(checkpoint: str) -> str:
    """The checkpoint file that `checkpoint` names: itself, or a run directory's checkpoint.pt."""
    return os.path.join(checkpoint, "checkpoint.pt") if os.path.isdir(checkpoint) else checkpoint


def deployed_policy(checkpoint: str, vec):
    """A checkpoint's policy as deployed (mean action, frozen normaliser), built by the script that wrote it, on the
    CPU; `checkpoint` is a checkpoint file or a run directory (its checkpoint.pt)."""
    path = checkpoint_file(checkpoint)
    written_by = torch.load(path, map_location="cpu", weights_only=True).get("script", "ppo_continuous")
    script = importlib.import_module(written_by)  # checkpoints from before it was recorded: ppo_continuous.py's
    loaded = script.load_checkpoint(path, "--checkpoint")
    return script.deployed_policy(script.args_from_checkpoint(loaded), vec, loaded, torch.device("cpu"))


def main(args: Args) -> dict:
    vec = envs.make("FrankaPickCube-v0", num_envs=args.num_envs, seed=args.seed, sim_device="cpu",
                    stagger_episodes=False)
    import genesis as gs

    kp = vec.robot.get_dofs_kp().clone()
    kp[..., NUM_ARM_JOINTS:] = args.finger_kp
    vec.robot.set_dofs_kp(kp[0] if kp.dim() == 2 else kp)
    obs, _ = vec.reset()
    policy = None
    if args.checkpoint:
        policy = deployed_policy(args.checkpoint, vec)
        memory = policy.initial_memory(args.num_envs, obs.device)  # one episode per env: never reset
    n = args.num_envs
    down = torch.tensor((0.0, 1.0, 0.0, 0.0), device=gs.device).expand(n, 4)  # the gripper pointing down
    descend, close, carry = args.phases
    carried = None
    rows = []
    for step in range(vec.max_episode_steps):
        cube, goal = vec.cube_pos.clone(), vec.goal_pos.clone()
        gripper = 1.0 if step < close else -1.0
        if step < descend:
            target = cube + torch.tensor((0.0, 0.0, 0.08), device=gs.device)
        elif step < carry:
            target = cube
        else:
            # The TCP's target puts the cube (held off the TCP by a little) on the goal.
            carried = vec.ee_pos.clone() if carried is None else carried
            wanted = goal + vec.ee_pos - cube
            carried = carried + (wanted - carried).clamp(-args.carry_speed, args.carry_speed)
            target = carried
        if policy is not None:
            with torch.inference_mode():
                action, *memory = policy(obs, *memory)
        else:
            q = vec.robot.inverse_kinematics(link=vec.hand, pos=target, quat=down, local_point=TCP_OFFSET)
            action = torch.zeros(n, NUM_ARM_JOINTS + 1, device=gs.device)
            action[:, :NUM_ARM_JOINTS] = ((q[:, :NUM_ARM_JOINTS] - vec.arm_target) / vec.action_scale).clamp(-1, 1)
            action[:, NUM_ARM_JOINTS] = gripper
        obs, reward, _, truncated, info = vec.step(action)
        row = {"step": step, "reward": reward.mean().item(), "grasped": vec.grasped.float().mean().item(),
               "cube_goal_m": vec.cube_to_goal.norm(dim=-1).mean().item(),
               "horizontal_m": vec.cube_to_goal[:, :2].norm(dim=-1).mean().item(),
               "vertical_m": vec.cube_to_goal[:, 2].abs().mean().item(), "cube_z_m": vec.cube_pos[:, 2].mean().item(),
               "joint_speed": vec.qd.norm(dim=-1).mean().item(), "gripper_action": action[:, -1].mean().item(),
               **{k: v.mean().item() for k, v in info["reward_terms"].items()}}
        if truncated.all():
            final = info["final_obs"]  # goal (40-42) and goal minus cube (46-48) on the episode's last step
            row["final_distance"], row["goal"] = final[:, 46:49].norm(dim=-1), final[:, 40:43]
            row["success"] = info["success"].float().mean().item()
            row["success_once"] = info["episode_metrics"]["success_once"].float().mean().item()
        rows.append(row)
    vec.close()
    keys = ["reward", "grasped", "cube_goal_m", "horizontal_m", "vertical_m", "cube_z_m", "joint_speed",
            "gripper_action", *info["reward_terms"]]
    print("| step | " + " | ".join(keys) + " |")
    print("|---:|" + "---:|" * len(keys))
    for row in rows:
        if row["step"] % 4 == 3 or row["step"] == len(rows) - 1:
            print(f"| {row['step']} | " + " | ".join(f"{row[k]:.3f}" for k in keys) + " |")
    last = rows[-1]
    failed = last["final_distance"] >= vec.goal_threshold
    for distance, goal in zip(last["final_distance"][failed].tolist(), last["goal"][failed].tolist()):
        print(f"missed by {distance:.3f} m: goal at ({goal[0]:.2f}, {goal[1]:.2f}, {goal[2]:.2f})")
    acting = f"checkpoint {args.checkpoint}" if policy is not None else f"carry speed {args.carry_speed} m/step"
    print(f"success at the end: {last['success']:.1%}, at any step: {last['success_once']:.1%} "
          f"({n} episodes, finger kp {args.finger_kp}, {acting})")
    return last


if __name__ == "__main__":
    main(tyro.cli(Args))
