"""The envs/ contract and the task's documented details on Go2Walk-v0 and its variants (CPU backend, a few envs).

Scene builds take seconds, so the scenes are module fixtures; each test starts from its own seeded reset.
"""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs
from conftest import (GO2_STATE_READ, check_episode_statistics, check_resume, check_seeding,
                      check_started_state_is_what_a_read_gives)
from envs.go2 import JOINT_NAMES, OBS_SCALES, Go2WalkVecEnv

EPISODE = 10
CPU = dict(sim_device="cpu", stagger_episodes=False)


def actions(num_envs, steps, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(num_envs, 12, generator=g) for _ in range(steps)]


@pytest.fixture(scope="module")
def batch():
    vec = gym.make_vec("Go2Walk-v0", num_envs=4, seed=0, max_episode_steps=EPISODE, **CPU)
    yield vec
    vec.close()


@pytest.fixture(scope="module")
def novel():
    vec = envs.make("Go2WalkNoVel-v0", num_envs=4, seed=0, max_episode_steps=EPISODE, **CPU)
    yield vec
    vec.close()


@pytest.fixture(scope="module")
def novelall():
    vec = envs.make("Go2WalkNoVelAll-v0", num_envs=4, seed=0, max_episode_steps=EPISODE, **CPU,
                    friction_range=[1.0, 1.0], added_mass_range=[0.0, 0.0])  # the defaults, as JSON gives them back
    yield vec
    vec.close()


@pytest.fixture(params=["Go2Walk-v0", "Go2WalkNoVel-v0"])
def either(request):
    """Each id in turn, for the contract's tests (the same 4-env scenes as `batch` and `novel`)."""
    return request.getfixturevalue("batch" if request.param == "Go2Walk-v0" else "novel")


def block(vec, name: str) -> slice:
    """Where an observation block is in `vec`'s observation (NoVel drops the first six entries)."""
    start, end = {"gravity": (6, 9), "joints": (12, 36), "joint_positions": (12, 24)}[name]
    shift = vec.single_observation_space.shape[0] - 48
    return slice(start + shift, end + shift)


@pytest.fixture(scope="module")
def long():
    """One robot, episodes three times as long as `batch`'s, same seed."""
    vec = envs.make("Go2Walk-v0", num_envs=1, seed=0, max_episode_steps=3 * EPISODE, **CPU)
    yield vec
    vec.close()


def rotate_to_body(vector: torch.Tensor, quat: torch.Tensor) -> torch.Tensor:
    """World-frame vectors in the base's frame: R(q)^T v, with R built from (w, x, y, z) by hand (not Genesis)."""
    w, x, y, z = quat.unbind(-1)
    rotation = torch.stack([
        torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        torch.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        torch.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], -2)
    return (rotation.transpose(-1, -2) @ vector.unsqueeze(-1)).squeeze(-1)


def test_registered_vector_entry_point_builds_the_native_batched_env(batch):
    """Bug: gym.make_vec wraps the Genesis task in a per-env SyncVectorEnv (or fails) instead."""
    assert isinstance(batch, Go2WalkVecEnv)
    obs, _ = batch.reset(seed=0)
    assert obs.shape == (4, 48) and obs.dtype == torch.float32
    assert batch.single_action_space.shape == (12,)


def test_observation_layout_and_scales_match_the_simulator_state(batch):
    """Bugs: a velocity in the world frame instead of the body's, a scale applied twice or not at all, joints in
    another order than the actions, or the previous action instead of the one just applied."""
    batch.reset(seed=1)
    for action in actions(4, 6, seed=1):
        obs = batch.step(action)[0]
    robot = batch.robot
    quat = robot.get_quat()
    motor_dofs = [robot.get_joint(name).dof_start for name in JOINT_NAMES]
    expected = {
        (0, 3): rotate_to_body(robot.get_vel(), quat) * OBS_SCALES["lin_vel"],
        (3, 6): rotate_to_body(robot.get_ang(), quat) * OBS_SCALES["ang_vel"],
        (6, 9): rotate_to_body(torch.tensor([0.0, 0.0, -1.0]).expand(4, 3), quat),
        (9, 12): batch.commands * torch.tensor([2.0, 2.0, 0.25]),
        (12, 24): robot.get_dofs_position(motor_dofs) - torch.tensor([0.0, 0.8, -1.5, 0.0, 0.8, -1.5,
                                                                      0.0, 1.0, -1.5, 0.0, 1.0, -1.5]),
        (24, 36): robot.get_dofs_velocity(motor_dofs) * OBS_SCALES["dof_vel"],
        (36, 48): action,
    }
    for (start, end), value in expected.items():
        torch.testing.assert_close(obs[:, start:end], value, atol=1e-4, rtol=1e-4, msg=f"obs[{start}:{end}]")
    assert obs[:, 0:6].abs().max() > 1e-2  # the robots move: the velocity entries are not trivially zero


# The entries of Go2Walk-v0's 48 each variant keeps (docs/tasks.md's table): NoVel drops the base velocities (0-5),
# NoVelAll the joint velocities (24-35) as well.
KEPT = {"novel": [*range(6, 48)], "novelall": [*range(6, 24), *range(36, 48)]}


@pytest.mark.parametrize("variant", KEPT)
def test_velocity_variants_hide_exactly_the_documented_entries(batch, variant, request):
    """Bug: a memory variant leaks a velocity (or drops a position entry) and no longer needs memory."""
    hidden = request.getfixturevalue(variant)
    kept = KEPT[variant]
    assert hidden.single_observation_space.shape == (len(kept),)
    full_obs, _ = batch.reset(seed=2)
    hidden_obs, _ = hidden.reset(seed=2)
    for action in actions(4, 4, seed=2):
        torch.testing.assert_close(hidden_obs, full_obs[:, kept], atol=1e-5, rtol=1e-5)
        full_obs, hidden_obs = batch.step(action)[0], hidden.step(action)[0]


def test_new_episodes_start_in_the_state_the_simulator_reads_back(batch):
    """The state after a reset is written in, not read again (one read per step: docs/tasks.md). Bugs: a velocity
    or a contact force left from the episode that ended, the gravity of the fallen pose, joints in another order."""
    check_started_state_is_what_a_read_gives(batch, GO2_STATE_READ, actions(4, 8, seed=2))


def test_actions_act_one_step_late_as_on_the_robot(either):
    """Bug: the simulated latency is lost (the action acts at once) or doubled (two steps late)."""
    either.reset(seed=3)
    kick = torch.zeros(4, 12)
    kick[1] = 2.0  # env 1 bends every joint 0.5 rad; env 0 holds the default pose
    standing = either.step(kick)[0]
    joints, positions = block(either, "joints"), block(either, "joint_positions")
    torch.testing.assert_close(standing[1, joints], standing[0, joints])  # same joints after the first step
    moved = either.step(torch.zeros(4, 12))[0]
    # the kick acted on the second step (kp 20: soft)
    assert (moved[1, positions] - moved[0, positions]).abs().min() > 0.01


def test_each_action_entry_drives_the_joint_it_names(batch):
    """Bug: targets reordered wrongly on their way to the simulator (its dofs are in the URDF's order, the actions in
    JOINT_NAMES'): a kick on one joint moves another. Envs 1-3 each kick one joint; env 0 holds the default pose."""
    for first in range(0, 12, 3):
        batch.reset(seed=5)
        kick = torch.zeros(4, 12)
        for env in (1, 2, 3):
            kick[env, first + env - 1] = 2.0
        batch.step(kick)
        moved = batch.step(torch.zeros(4, 12))[0][:, block(batch, "joint_positions")]  # one step late
        for env in (1, 2, 3):
            assert int((moved[env] - moved[0]).abs().argmax()) == first + env - 1


def test_final_obs_is_the_last_obs_of_the_truncated_episode(batch, long):
    """Bug: bootstrapping a time-limited episode from the reset observation (standing at the start, new command)."""
    obs, _ = batch.reset(seed=4)
    long_obs, _ = long.reset(seed=4)
    torch.testing.assert_close(obs[:1], long_obs)
    for t, action in enumerate(actions(1, EPISODE, seed=4, scale=0.3)):
        obs, _, terminated, truncated, info = batch.step(action.expand(4, 12))
        long_obs, _, long_terminated, long_truncated, _ = long.step(action)
        assert not long_terminated.any() and not long_truncated.any()
        assert not terminated[0] and truncated[0].item() == (t == EPISODE - 1)
        torch.testing.assert_close(info["final_obs"][:1], long_obs, atol=1e-4, rtol=1e-4)
    assert info["episode"]["l"][0].item() == EPISODE and info["episode_metrics"]["fell"][0].item() == 0.0
    assert obs[0, 12:36].abs().max() < 1e-4  # the next episode starts in the default pose, at rest


def test_tipping_over_terminates_and_counts_as_a_fall(either):
    """Bugs: a fall reported as a truncation (so bootstrapped as if the robot walked on), or a tilt below the
    limit ending the episode."""
    either.reset(seed=5)
    roll = math.radians(25.0)  # env 2 rolls past 10 degrees; env 3 leans 5 degrees and must go on
    lean = math.radians(5.0)
    qpos = either.robot.get_qpos()
    qpos[2, 3:7] = torch.tensor([math.cos(roll / 2), math.sin(roll / 2), 0.0, 0.0])
    qpos[3, 3:7] = torch.tensor([math.cos(lean / 2), 0.0, math.sin(lean / 2), 0.0])
    either.robot.set_qpos(qpos, zero_velocity=True)
    obs, reward, terminated, truncated, info = either.step(torch.zeros(4, 12))
    assert terminated.tolist() == [False, False, True, False] and not truncated.any()
    assert info["episode_metrics"]["fell"].tolist() == [0.0, 0.0, 1.0, 0.0]
    gravity = block(either, "gravity")
    assert info["final_obs"][2, gravity][1] < -math.sin(math.radians(10.0))  # seen sideways: the tilted last state
    assert obs[2, gravity].tolist() == pytest.approx([0.0, 0.0, -1.0], abs=1e-4)  # upright again in the next one


def test_commands_are_drawn_in_range_and_renewed_every_resampling_period():
    """Bugs: commands drawn once per episode (the example's 4-s renewal lost), or outside the documented ranges."""
    vec = envs.make("Go2Walk-v0", num_envs=64, seed=6, resampling_time_s=0.1, max_episode_steps=100, **CPU)
    obs, _ = vec.reset()
    seen = [obs[:, 9:12] / torch.tensor([2.0, 2.0, 0.25])]
    for _ in range(10):
        obs = vec.step(torch.zeros(64, 12))[0]
        seen.append(obs[:, 9:12] / torch.tensor([2.0, 2.0, 0.25]))
    vec.close()
    changed = [not torch.allclose(seen[t], seen[t - 1]) for t in range(1, 11)]
    assert changed == [t % 5 == 0 for t in range(1, 11)]  # 0.1 s = 5 steps of 0.02 s
    commands = torch.cat(seen)
    assert commands[:, 0].min() >= 0.0 and commands[:, 0].max() <= 1.0 and commands[:, 0].std() > 0.2
    assert (commands[:, 1] == 0).all() and commands[:, 2].abs().max() <= 0.5 + 1e-6


def test_reward_terms_sum_to_the_reward_with_the_documented_signs(either):
    """Bug: a term with the wrong sign (rewarding a bouncing base) or one left out of the sum."""
    either.reset(seed=7)
    seen = {}
    for action in actions(4, 8, seed=7):
        _, reward, _, _, info = either.step(action)
        torch.testing.assert_close(sum(info["reward_terms"].values()), reward)
        for name, value in info["reward_terms"].items():
            seen.setdefault(name, []).append(value)
    seen = {name: torch.cat(values) for name, values in seen.items()}
    assert set(seen) == {"tracking_lin_vel", "tracking_ang_vel", "lin_vel_z", "base_height", "action_rate",
                         "similar_to_default"}
    for name in ("tracking_lin_vel", "tracking_ang_vel"):
        assert (seen[name] > 0).all() and (seen[name] <= 0.02 * (1.0 if "lin" in name else 0.2) + 1e-7).all()
    for name in ("lin_vel_z", "base_height", "action_rate", "similar_to_default"):
        assert (seen[name] <= 0).all() and (seen[name] < 0).any(), name


def test_episode_metrics_are_the_episode_means_of_the_tracking_errors(batch):
    """Bug: the tracking errors reported at episode end are the last step's, or include the next episode."""
    batch.reset(seed=8)
    lin_errors, ang_errors = [], []
    for action in actions(4, EPISODE, seed=8, scale=0.3):
        obs, _, _, _, info = batch.step(action)
        final = info["final_obs"]
        lin_errors.append((final[:, 9:11] - final[:, 0:2]).norm(dim=-1) / OBS_SCALES["lin_vel"])
        ang_errors.append((final[:, 11] - final[:, 5]).abs() / OBS_SCALES["ang_vel"])
    ended = info["episode"]["mask"]
    assert ended.all()
    metrics = info["episode_metrics"]
    torch.testing.assert_close(metrics["lin_vel_error"], torch.stack(lin_errors).mean(0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(metrics["ang_vel_error"], torch.stack(ang_errors).mean(0), atol=1e-4, rtol=1e-4)


def test_episode_statistics_are_raw_returns_and_lengths(either):
    """Bug: returns that are not the sum of raw rewards, or lengths that run across episodes."""
    either.reset(seed=9)
    assert check_episode_statistics(either, actions(4, 25, seed=9, scale=1.5)) >= 8


def test_same_seed_reproduces_the_trajectory_and_another_seed_does_not(long):
    """Bug: commands drawn from an unseeded generator."""
    check_seeding([(long, 3), (long, 3), (long, 4)], actions(1, 5, seed=1), atol=1e-5)


def test_state_dict_resumes_the_same_trajectory(either):
    """Bugs: a resumed run restarts the robots, forgets the commands or the action in flight (the latency); Genesis's
    contact solver's warm start not restored, so trajectories agreed to float precision only until the next new
    contact (the feet land at about the sixth step)."""
    either.reset(seed=10)
    for action in actions(4, 3, seed=10):
        either.step(action)
    check_resume(either, lambda: envs.make("Go2Walk-v0", num_envs=4, seed=99, max_episode_steps=EPISODE,
                                           observe_base_velocity="base_lin_vel" in either.observed, **CPU),
                 actions(4, EPISODE + 2, seed=11))


def test_subset_reset_touches_only_the_masked_envs(either):
    """Bug: resetting one robot moves the others or redraws their commands."""
    either.reset(seed=12)
    for action in actions(4, 3, seed=12):
        obs = either.step(action)[0]
    mask = torch.tensor([False, True, False, False])
    new_obs, _ = either.reset(options={"reset_mask": mask})
    torch.testing.assert_close(new_obs[~mask], obs[~mask])
    assert either.episode_step[1] == 0 and new_obs[1, block(either, "joints")].abs().max() < 1e-4


def test_nonfinite_state_in_one_env_resets_that_env_only(either):
    """Bug: one diverged robot raises for the whole either or poisons the rollout with NaN."""
    either.reset(seed=13)
    obs = either.step(torch.zeros(4, 12))[0]
    either.robot.set_dofs_velocity(torch.full((1, 18), float("nan")), envs_idx=[3])
    new_obs, reward, terminated, truncated, info = either.step(torch.zeros(4, 12))
    assert info["sim_errors"].tolist() == [False, False, False, True]
    assert truncated[3] and not terminated.any() and torch.isfinite(reward).all()
    torch.testing.assert_close(info["final_obs"][3], obs[3])
    for _ in range(12):  # past Genesis's periodic whole-either error check
        assert torch.isfinite(either.step(torch.zeros(4, 12))[0]).all()


@pytest.mark.parametrize("kwargs,match", [
    ({"dt": 0.0}, "dt"),
    ({"lin_vel_x_range": (1.0, 0.0)}, "lin_vel_x_range"),
    ({"max_episode_steps": 0}, "max_episode_steps"),
    ({"render_mode": "human"}, "render_mode"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs.make("Go2Walk-v0", num_envs=2, sim_device="cpu", **kwargs)


def test_headless_video_frame_shows_the_robot():
    """Bug: --capture-video needs a display, renders a blank frame, or loses the robot once it walks away."""
    vec = envs.make("Go2Walk-v0", num_envs=2, sim_device="cpu", render_mode="rgb_array")
    vec.reset()
    qpos = vec.robot.get_qpos()
    qpos[:, 0] += 5.0  # five metres away from where the camera started
    vec.robot.set_qpos(qpos, zero_velocity=True)
    vec.step(torch.zeros(2, 12))
    frame = vec.render()
    vec.close()
    assert frame.shape == (360, 480, 3) and frame.dtype == np.uint8
    # The robot (light grey) stays in the middle of the frame, over a dark checkered floor.
    bright = frame.mean(-1) > 150
    assert bright[100:260, 140:340].mean() > 0.02 and bright.mean() < 0.05


# ---------------------------------------------------------------- the critic's observation (docs/design.md §3)
def feet_on_ground(vec) -> torch.Tensor:
    """Which feet touch the ground, from the simulator's contacts (the critic observation's last four entries)."""
    feet = [vec.robot.get_link(name).idx_local for name in ("FR_calf", "FL_calf", "RR_calf", "RL_calf")]
    return (vec.robot.get_links_net_contact_force()[:, feet].norm(dim=-1) > 1.0).float()


@pytest.mark.parametrize("variant", ["batch", *KEPT])
def test_the_critic_sees_every_velocity_and_which_feet_touch_the_ground(batch, variant, request):
    """Bugs: the critic as blind as the policy (a hidden velocity missing from its observation), its entries out
    of step with the policy's (another step's, another env's), or contacts of other links than the feet."""
    vec = request.getfixturevalue(variant)
    kept = KEPT.get(variant, [*range(48)])
    assert vec.single_critic_observation_space.shape == (52,)
    obs, info = vec.reset(seed=14)
    full_obs = batch.reset(seed=14)[0] if vec is not batch else obs  # Go2Walk-v0's observation, the same robots
    touching = 0.0
    for action in actions(4, 8, seed=14):
        torch.testing.assert_close(info["critic_obs"][:, :48], full_obs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(info["critic_obs"][:, kept], obs)
        torch.testing.assert_close(info["critic_obs"][:, 48:], feet_on_ground(vec))
        touching += info["critic_obs"][:, 48:].sum().item()
        obs, info = vec.step(action)[::4]
        full_obs = batch.step(action)[0] if vec is not batch else obs
    assert 0 < touching < 8 * 4 * 4  # the feet land and lift: the contacts are not constant


def test_ranges_given_as_lists_are_the_same_ranges(novelall):
    """Bug: `[1.0, 1.0] != (1.0, 1.0)`, so the default ranges read back from JSON as lists (an exported model's
    settings) turned the randomisation on: per-env link data, and two more entries in the critic's observation."""
    assert not novelall.randomise_dynamics and novelall.single_critic_observation_space.shape == (48 + 4,)  # feet


def test_the_critic_bootstraps_from_its_own_last_observation_of_a_truncated_episode(novelall, long):
    """Bug: the critic's final observation taken after the autoreset (standing at the start, a new command), or
    the policy's final observation handed to the critic."""
    novelall.reset(seed=15)
    _, long_info = long.reset(seed=15)
    for t, action in enumerate(actions(1, EPISODE, seed=15, scale=0.3)):
        obs, _, _, truncated, info = novelall.step(action.expand(4, 12))
        _, _, _, _, long_info = long.step(action)
        torch.testing.assert_close(info["final_critic_obs"][:1, :48], long_info["critic_obs"][:, :48], atol=1e-4,
                                   rtol=1e-4)
        torch.testing.assert_close(info["final_critic_obs"][:, KEPT["novelall"]], info["final_obs"])
    assert truncated[0] and not torch.allclose(info["final_critic_obs"][0], info["critic_obs"][0])


def test_subset_reset_and_blow_up_keep_the_critic_observation_in_step(novelall):
    """Bugs: resetting some robots leaves their critic observation stale (or redraws the others'); a diverged
    robot's critic observation passed on non-finite, or its final one not the last finite one."""
    novelall.reset(seed=16)
    for action in actions(4, 3, seed=16):
        _, _, _, _, info = novelall.step(action)
    mask = torch.tensor([False, True, False, False])
    obs, reset_info = novelall.reset(options={"reset_mask": mask})
    torch.testing.assert_close(reset_info["critic_obs"][~mask], info["critic_obs"][~mask])
    torch.testing.assert_close(reset_info["critic_obs"][:, KEPT["novelall"]], obs)
    assert reset_info["critic_obs"][1, :6].abs().max() < 1e-4  # the reset robot stands at rest
    novelall.robot.set_dofs_velocity(torch.full((1, 18), float("nan")), envs_idx=[3])
    _, _, _, _, info = novelall.step(torch.zeros(4, 12))
    assert info["sim_errors"].tolist() == [False, False, False, True] and torch.isfinite(info["critic_obs"]).all()
    torch.testing.assert_close(info["final_critic_obs"][3], reset_info["critic_obs"][3])
