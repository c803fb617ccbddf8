"""The envs/ contract and the documented details of the Panda's cube tasks and of the reaching variants
FrankaReachCue-v0 and FrankaReachDelay-v0 (CPU backend, a few envs). Scene builds take seconds, so the scenes are
module fixtures; each test starts from a seeded reset.
"""

import os

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs
from benchmarks import privileged_critic_variants, stack_probe
from conftest import (SCRIPTS, check_episode_statistics, check_resume, check_seeding, metrics_without_timing,
                      script_named)
from envs.franka import TCP_OFFSET
from envs.franka_cube import CUBE_HALF_SIZE, CUBE_SEPARATION, FrankaCubeVecEnv

CPU = dict(sim_device="cpu", stagger_episodes=False)
EPISODE = 10
CUBE_IDS = ("FrankaPushCube-v0", "FrankaPushCubeRandom-v0", "FrankaPickCube-v0")
STACK_IDS = ("FrankaStackCube-v0", "FrankaStackCubeRandom-v0")
REACH_IDS = ("FrankaReachCue-v0", "FrankaReachDelay-v0")
# A joint pose found by sampling that drives the hand link into the table (the fingers stay clear of it).
HAND_ON_TABLE = (-0.0188, -0.8762, -2.2202, -2.9755, -2.4453, 1.4852, 1.5889)


def actions(vec, steps, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    shape = (vec.num_envs, vec.single_action_space.shape[0])
    return [scale * (2 * torch.rand(*shape, generator=g) - 1) for _ in range(steps)]


@pytest.fixture(scope="module")
def scenes():
    made = {env_id: envs.make(env_id, num_envs=4, seed=0, max_episode_steps=EPISODE, **CPU)
            for env_id in (*CUBE_IDS, *STACK_IDS, *REACH_IDS)}
    for env_id, vec in made.items():
        vec.env_id = env_id
    yield made
    for vec in made.values():
        vec.close()


@pytest.fixture(params=CUBE_IDS)
def cube_task(request, scenes):
    return scenes[request.param]


@pytest.fixture(params=(*CUBE_IDS, *STACK_IDS, *REACH_IDS))
def any_task(request, scenes):
    return scenes[request.param]


def test_registered_ids_have_the_documented_spaces(scenes):
    """Bug: an observation block dropped or doubled, or the gripper missing from (or leaking into) the actions."""
    shapes = {env_id: (vec.single_observation_space.shape[0], vec.single_action_space.shape[0])
              for env_id, vec in scenes.items()}
    assert shapes == {"FrankaPushCube-v0": (44, 7), "FrankaPushCubeRandom-v0": (44, 7),
                      "FrankaPickCube-v0": (49, 8), "FrankaReachCue-v0": (34, 7), "FrankaReachDelay-v0": (33, 7),
                      "FrankaStackCube-v0": (59, 8), "FrankaStackCubeRandom-v0": (59, 8)}
    for vec in scenes.values():
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (4, vec.single_observation_space.shape[0]) and obs.dtype == torch.float32


def test_cube_starts_at_rest_on_the_table_and_the_goal_is_where_documented(cube_task):
    """Bugs: the cube spawned inside the table or in the air (it jumps or falls at the first step), outside its
    documented area, or a goal that is not 0.2 m beyond the cube (push) or is under the table (pick)."""
    cube_task.reset(seed=1)
    start = cube_task.cube.get_pos().clone()
    assert torch.allclose(start[:, 2], torch.full((4,), CUBE_HALF_SIZE))
    assert ((start[:, 0] >= 0.4) & (start[:, 0] <= 0.6) & (start[:, 1].abs() <= 0.1)).all()
    goal = cube_task.goal_pos
    if cube_task.single_action_space.shape[0] == 7:  # push: on the table, further out; fingers closed
        assert (cube_task.robot.get_dofs_position()[:, 7:] < 0.005).all()
        torch.testing.assert_close(goal[:, 0], start[:, 0] + 0.2)
        assert (goal[:, 1].abs() <= 0.1).all() and (goal[:, 2] == 0).all()
    else:
        assert ((goal[:, 2] >= 0.05) & (goal[:, 2] <= 0.3)).all()
    for _ in range(5):  # the arm holds still near home, far above the cube
        cube_task.step(torch.zeros(4, cube_task.single_action_space.shape[0]))
    torch.testing.assert_close(cube_task.cube.get_pos(), start, atol=1e-3, rtol=0)


def test_reward_terms_are_finite_bounded_sum_to_the_reward_and_have_the_documented_signs(cube_task):
    """Bugs: a term that changes sign or grows without bound (a shaping term dividing by a distance that crosses
    zero), or one left out of the sum."""
    cube_task.reset(seed=2)
    seen = {}
    for action in actions(cube_task, 30, seed=2):
        _, reward, _, _, info = cube_task.step(action)
        torch.testing.assert_close(sum(info["reward_terms"].values()), reward)
        for name, value in info["reward_terms"].items():
            seen.setdefault(name, []).append(value)
    seen = {name: torch.cat(values) for name, values in seen.items()}
    positive = {"reach", "push", "success"} if "push" in seen else {"reach", "grasp", "place", "still", "success"}
    assert set(seen) == positive | {"table_contact", "action_rate"}
    for name, value in seen.items():
        assert torch.isfinite(value).all(), name
        action_rate_bound = -0.01 * 4 * cube_task.single_action_space.shape[0]  # 0.01 x max squared change
        low, high = ((0.0, 1.0) if name in positive else (-0.5, 0.0) if name == "table_contact"
                     else (action_rate_bound, 0.0))
        assert ((value >= low) & (value <= high)).all(), name
    assert (seen["reach"] > 0).all() and (seen["action_rate"] < 0).any()


def test_an_arm_link_on_the_table_is_penalised_and_the_fingers_are_not(scenes):
    """Bugs: the contact penalty never fires (wrong link indices, contacts read before the step), or fires for the
    fingers, which must touch the table to push a cube."""
    push = scenes["FrankaPushCube-v0"]
    push.reset(seed=3)
    qpos = push.robot.get_qpos()
    qpos[0, :7] = torch.tensor(HAND_ON_TABLE)
    push.robot.set_qpos(qpos, zero_velocity=True)
    push.arm_target[:] = qpos[:, :7]
    contact = push.step(torch.zeros(4, 7))[4]["reward_terms"]["table_contact"]
    assert contact[0] == -0.5 and (contact[1:] == 0).all()
    # Fingertips pressed on the table (the arm stretched down until they stop): no penalty.
    push.reset(seed=3)
    down = torch.zeros(4, 7)
    down[:, 1] = down[:, 3] = 1.0
    push.max_episode_steps = 40
    try:
        for _ in range(30):
            info = push.step(down)[4]
    finally:
        push.max_episode_steps = EPISODE
    assert (push.ee_pos[:, 2] < 0.02).all() and (info["reward_terms"]["table_contact"] == 0).all()


def test_success_means_the_cube_in_the_goal_at_the_end_and_success_once_at_any_step(scenes):
    """Bugs: success read mid-episode, a cube that visited the goal counted as solved at the end, or the
    any-time rate forgetting a visit."""
    push = scenes["FrankaPushCube-v0"]
    push.reset(seed=4)
    first = torch.tensor([0])
    on_goal = push.goal_pos[:1].clone()
    on_goal[:, 2] = CUBE_HALF_SIZE
    push.cube.set_pos(on_goal, envs_idx=first)
    info = push.step(torch.zeros(4, 7))[4]
    assert info["reward_terms"]["success"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert not info["success"].any()  # the episode goes on
    for _ in range(EPISODE - 1):
        info = push.step(torch.zeros(4, 7))[4]
    assert info["success"].tolist() == [True, False, False, False]
    assert info["episode_metrics"]["success_once"].tolist() == [1.0, 0.0, 0.0, 0.0]
    # Visited, then pushed out before the end: solved once, not at the end.
    push.reset(seed=4)
    push.cube.set_pos(on_goal, envs_idx=first)
    push.step(torch.zeros(4, 7))
    away = push.cube.get_pos()[:1]
    away[:, 0] -= 0.3
    push.cube.set_pos(away, envs_idx=first)
    for _ in range(EPISODE - 1):
        info = push.step(torch.zeros(4, 7))[4]
    assert info["success"].tolist() == [False] * 4
    assert info["episode_metrics"]["success_once"].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_gripper_action_opens_and_closes_the_fingers(scenes):
    """Bug: the gripper action ignored (fingers stuck open) or inverted (-1 opening)."""
    pick = scenes["FrankaPickCube-v0"]
    pick.reset(seed=5)
    assert (pick.fingers > 0.039).all()  # episodes start open
    close = torch.zeros(4, 8)
    close[:, 7] = -1.0
    for _ in range(5):
        pick.step(close)
    assert (pick.fingers < 0.005).all()
    for _ in range(5):
        obs = pick.step(-close)[0]
    assert (pick.fingers > 0.039).all()
    torch.testing.assert_close(obs[:, 22:24], pick.fingers)


def test_cue_target_is_visible_exactly_the_first_cue_steps(scenes):
    """Bugs: the target visible all episode (no memory needed), never, or one step too many; the visible flag
    out of step with it; the cue keyed to the staggered step counter instead of the episode's own age."""
    cue = scenes["FrankaReachCue-v0"]
    obs, _ = cue.reset(seed=6)
    cue.episode_step[:] = torch.tensor([0, 2, 1, 2])  # as staggered first episodes start (none ends below)
    target, to_target, flag = slice(20, 23), slice(23, 26), 33
    for age, action in enumerate(actions(cue, 8, seed=6, scale=0.3)):
        visible = age < cue.cue_steps
        assert (obs[:, flag] == float(visible)).all(), age
        if visible:
            torch.testing.assert_close(obs[:, target], cue.target_pos)
            torch.testing.assert_close(obs[:, to_target], cue.target_pos - cue.ee_pos)
        else:
            assert (obs[:, target] == 0).all() and (obs[:, to_target] == 0).all()
        obs = cue.step(action)[0]


def test_the_delayed_arm_moves_by_the_action_sent_delay_steps_earlier_and_observes_the_one_sent(scenes):
    """Bugs: the delay ignored or off by one (the arm moved by the action of one step too many or too few), one
    delay for every env, or the observed previous action the delayed one (which the policy did not just send)."""
    delayed = scenes["FrankaReachDelay-v0"]
    delayed.reset(seed=30)
    delayed.action_delay[:] = torch.tensor([0, 1, 2, 3])
    start = delayed.arm_target.clone()
    pulse = torch.zeros(4, 7)
    pulse[:, 0] = 1.0
    moved_at = torch.full((4,), -1)
    for step in range(5):
        obs = delayed.step(pulse if step == 0 else torch.zeros(4, 7))[0]
        torch.testing.assert_close(obs[:, -7:], pulse if step == 0 else torch.zeros(4, 7))
        moved = (delayed.arm_target[:, 0] - start[:, 0]).abs() > 1e-6
        moved_at[moved & (moved_at < 0)] = step
    assert moved_at.tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(delayed.arm_target[:, 0] - start[:, 0], torch.full((4,), delayed.action_scale))


def test_the_delay_is_drawn_per_episode_in_range_and_a_new_episode_has_nothing_in_flight(scenes):
    """Bugs: one draw for every env or episode (nothing to infer), a delay outside the documented 0-3 steps, or a
    new episode's arm moved by the last actions of the episode before it."""
    delayed = scenes["FrankaReachDelay-v0"]
    draws = []
    for seed in range(40, 50):
        delayed.reset(seed=seed)
        draws.append(delayed.action_delay.clone())
    draws = torch.stack(draws)
    assert draws.min() == 0 and draws.max() == 3 and len(set(draws.flatten().tolist())) == 4
    assert (draws != draws[:, :1]).any(dim=1).any() and (draws != draws[:1]).any(dim=0).any()
    for action in actions(delayed, 3, seed=40):
        delayed.step(action)
    assert delayed.actions_in_flight.abs().sum() > 0
    target = delayed.arm_target.clone()
    delayed.reset(options={"reset_mask": torch.tensor([True, False, False, False])})
    assert (delayed.actions_in_flight[0] == 0).all() and (delayed.actions_in_flight[1:].abs().sum(-1) > 0).any()
    held = delayed.arm_target[0].clone()
    delayed.step(torch.zeros(4, 7))
    torch.testing.assert_close(delayed.arm_target[0], held)  # nothing left to arrive for the new episode
    assert not torch.equal(delayed.arm_target[1:], target[1:])


# The documented ranges of what the randomised tasks draw per episode (docs/tasks.md), column by column.
DRAWN = {"FrankaPushCubeRandom-v0": ((0.05, 1.0), (0.05, 1.0), (0.05, 1.0)),
         "FrankaStackCubeRandom-v0": ((0.02, 0.15), (0.02, 0.15), (0.3, 1.0), (0.3, 1.0), (0.3, 1.0))}


@pytest.mark.parametrize("env_id", DRAWN)
def test_randomised_dynamics_differ_per_episode_stay_in_range_and_are_not_observed(scenes, env_id):
    """Bugs: one draw for every env or every episode (nothing to infer), values outside the documented ranges, a
    draw that never reaches the simulator (a cube's mass), or the masses or frictions leaking into the observation."""
    rand = scenes[env_id]
    rand.reset(seed=7)
    first = rand.dynamics.clone()
    rand.reset(seed=8)
    second = rand.dynamics.clone()
    both = torch.cat([first, second])
    assert len(set(both[:, 0].tolist())) == 8 and not torch.allclose(first, second)
    for column, (low, high) in enumerate(DRAWN[env_id]):
        assert ((both[:, column] >= low) & (both[:, column] <= high)).all(), column
    for column, body in enumerate(("cube", "cube_b")[:1 + hasattr(rand, "cube_b")]):
        mass = getattr(rand, body).get_links_mass()
        torch.testing.assert_close(mass[:, 0] if mass.dim() > 1 else mass, second[:, column])
    obs = rand._observe()
    rand.dynamics[:] = torch.tensor(DRAWN[env_id])[:, 1]
    rand._send_dynamics(torch.arange(4))
    torch.testing.assert_close(rand._observe(), obs)


def test_the_critic_noise_benchmark_draws_per_episode_and_keeps_the_simulator_fixed(scenes, monkeypatch):
    """Bugs in benchmarks/privileged_critic_variants.py's noise: the draws still reaching the simulator (it would
    measure the dynamics after all) or no longer drawn (the critic would read constants, as with the ranges
    narrowed)."""
    rand = scenes["FrankaStackCubeRandom-v0"]
    monkeypatch.setattr(FrankaCubeVecEnv, "_send_dynamics", FrankaCubeVecEnv._send_dynamics)  # undone at the end
    rand.reset(seed=5)
    masses, drawn = rand.cube.get_links_mass().clone(), rand.dynamics.clone()
    privileged_critic_variants.keep_dynamics_fixed()
    obs, info = rand.reset(seed=6)
    assert len(set(rand.dynamics[:, 0].tolist())) == 4 and not torch.allclose(rand.dynamics, drawn)
    torch.testing.assert_close(info["critic_obs"], torch.cat([obs, rand.dynamics], dim=-1))
    torch.testing.assert_close(rand.cube.get_links_mass(), masses)
    monkeypatch.undo()
    rand._send_dynamics(torch.arange(4))  # the shared scene as its draws say, for the tests after this one


@pytest.mark.parametrize("variant, read", [("masses-only", "mass"), ("frictions-only", "friction")])
def test_the_critic_reads_only_the_named_draws_and_the_simulator_gets_them_all(scenes, monkeypatch, variant, read):
    """Bugs in benchmarks/privileged_critic_variants.py's masses-only and frictions-only: the other draws still in
    the critic observation, the named ones replaced too, or the draws kept from the simulator."""
    rand = scenes["FrankaStackCubeRandom-v0"]
    for method in ("_observe_critic", "_send_dynamics"):  # undone at the end
        monkeypatch.setattr(FrankaCubeVecEnv, method, getattr(FrankaCubeVecEnv, method))
    privileged_critic_variants.VARIANTS[variant]()
    obs, info = rand.reset(seed=9)
    critic_obs = info["critic_obs"]
    torch.testing.assert_close(critic_obs[:, :59], obs)
    middle = (rand.dynamics_low + rand.dynamics_high) / 2
    for column, name in enumerate(rand.dynamics_names, start=59):
        expected = rand.dynamics[:, column - 59] if name.endswith(read) else middle[column - 59].expand(4)
        torch.testing.assert_close(critic_obs[:, column], expected, msg=name)
    assert len(set(rand.dynamics[:, rand.dynamics_names.index("cube_friction")].tolist())) == 4
    drawn_mass = rand.dynamics[:, rand.dynamics_names.index("cube_mass")]
    torch.testing.assert_close(rand.cube.get_links_mass()[:, 0], drawn_mass)


def test_the_zero_init_variant_zeroes_only_the_critics_weights_on_the_privileged_columns(monkeypatch):
    """Bugs in benchmarks/privileged_critic_variants.py's zero-init: weights on the policy's observation zeroed too,
    the privileged ones left as drawn, or the actor's initial weights changed (then it tests two things at once)."""
    script = script_named("ppo_continuous").module
    args = script.parse_args(["--env-id", "FrankaStackCubeRandom-v0"])
    spaces = (gym.spaces.Box(-1, 1, (59,)), gym.spaces.Box(-1, 1, (8,)), gym.spaces.Box(-1, 1, (64,)))
    torch.manual_seed(3)
    drawn = script.Agent(args, *spaces)
    monkeypatch.setattr(script.Agent, "__init__", script.Agent.__init__)  # undone at the end
    privileged_critic_variants.zero_privileged_weights()
    torch.manual_seed(3)
    zeroed = script.Agent(args, *spaces)
    first, first_drawn = zeroed.critic[0].weight, drawn.critic[0].weight
    assert (first[:, 59:] == 0).all() and (first_drawn[:, 59:] != 0).all()
    torch.testing.assert_close(first[:, :59], first_drawn[:, :59])
    for name, value in drawn.state_dict().items():
        if name != "critic.0.weight":
            torch.testing.assert_close(zeroed.state_dict()[name], value)


def test_env_kwargs_narrows_drawn_ranges_from_the_command_line():
    """Bugs: `--env-kwargs cube_mass_range 0.07,0.07` left a string the task cannot draw from, ranges given as two
    words each (which tyro pairs up wrongly: `{'cube_mass_range': 0.07, '0.07': 'table_friction_range', ...}`), or
    ranges parsed and then not the ones the task draws from."""
    for name in SCRIPTS:
        args = script_named(name).module.parse_args([
            "--env-id", "FrankaPushCubeRandom-v0", "--sim-device", "cpu",
            "--env-kwargs", "cube_mass_range", "0.07,0.07", "table_friction_range", "0.5,0.5", "decimation", "4"])
        assert args.env_kwargs == {"cube_mass_range": (0.07, 0.07), "table_friction_range": (0.5, 0.5),
                                   "decimation": 4}, name
    vec = script_named("ppo_continuous").module.make_env(args, 3, seed=1, device=torch.device("cpu"),
                                                         stagger_episodes=False)
    try:
        vec.reset(seed=1)
        drawn = vec.dynamics  # the cube's mass, the cube's friction, the table's friction
        torch.testing.assert_close(drawn[:, 0], torch.full((3,), 0.07))
        torch.testing.assert_close(vec.cube.get_links_mass()[:, 0], torch.full((3,), 0.07))
        torch.testing.assert_close(drawn[:, 2], torch.full((3,), 0.5))
        assert len(set(drawn[:, 1].tolist())) == 3 and vec.decimation == 4
    finally:
        vec.close()


def test_a_heavy_slippery_cube_moves_differently_from_a_light_grippy_one(scenes):
    """Bug: the drawn mass and friction do not change the physics, so there is nothing for memory to infer."""
    rand = scenes["FrankaPushCubeRandom-v0"]
    rand.reset(seed=9)
    rand.dynamics[:] = torch.tensor([[0.05, 1.0, 1.0], [1.0, 0.05, 0.05], [0.05, 1.0, 1.0], [1.0, 0.05, 0.05]])
    rand._send_dynamics(torch.arange(4))
    start = rand.cube.get_pos().clone()
    rand.cube.set_dofs_velocity(torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.0, 0.0]]).repeat(4, 1))  # a shove along x
    for _ in range(3):
        rand.step(torch.zeros(4, 7))
    slid = (rand.cube.get_pos() - start)[:, 0]
    assert slid[1] > 2 * slid[0] and slid[3] > 2 * slid[2]


def test_episode_statistics_are_raw_returns_and_lengths(any_task):
    any_task.reset(seed=10)
    assert check_episode_statistics(any_task, actions(any_task, 25, seed=10)) >= 8


def test_same_seed_reproduces_the_trajectory_and_another_seed_does_not(any_task):
    """Bug: cube positions, goals, dynamics or cues drawn from an unseeded generator."""
    check_seeding([(any_task, 3), (any_task, 3), (any_task, 4)], actions(any_task, 4, seed=1, scale=0.3), atol=1e-5)


def test_state_dict_resumes_the_same_trajectory(any_task):
    """Bugs: a resumed run restores the arm but not the cube (or its drawn mass and friction, or the cue's age); the
    saved state holds the env's live tensors, which later steps change; Genesis's own state (the solver's warm start,
    the link poses) not restored, so a resumed run leaves the uninterrupted one at the seventh digit."""
    any_task.reset(seed=11)
    for action in actions(any_task, 3, seed=11, scale=0.3):
        any_task.step(action)
    if hasattr(any_task, "cube"):  # a cube in flight: its velocity matters
        any_task.cube.set_pos(torch.tensor([[0.45, 0.05, 0.2]]), envs_idx=torch.tensor([2]))
    if hasattr(any_task, "cube_b"):  # and the other one
        any_task.cube_b.set_pos(torch.tensor([[0.55, -0.05, 0.15]]), envs_idx=torch.tensor([1]))
    any_task.step(torch.zeros(4, any_task.single_action_space.shape[0]))
    check_resume(any_task, lambda: envs.make(any_task.env_id, num_envs=4, seed=99, max_episode_steps=EPISODE, **CPU),
                 actions(any_task, EPISODE + 2, seed=12, scale=0.3))


def test_subset_reset_touches_only_the_masked_envs(any_task):
    any_task.reset(seed=13)
    for action in actions(any_task, 3, seed=13, scale=0.3):
        obs = any_task.step(action)[0]
    mask = torch.tensor([False, True, False, False])
    new_obs, _ = any_task.reset(options={"reset_mask": mask})
    torch.testing.assert_close(new_obs[~mask], obs[~mask])
    assert any_task.episode_step[1] == 0 and new_obs[1, 7:14].abs().max() < 1e-4  # joints at rest


@pytest.mark.parametrize("env_id", ["FrankaPushCube-v0", "FrankaPickCube-v0", "FrankaStackCube-v0"])
def test_headless_video_frame_shows_table_cube_goal_and_gripper(env_id):
    """Bug: --capture-video renders without the cube or the goal marker, or the marker collides with the cube."""
    vec = envs.make(env_id, num_envs=2, render_mode="rgb_array", **CPU)
    vec.reset(seed=0)
    start = vec.cube.get_pos().clone()
    for _ in range(3):
        vec.step(torch.zeros(2, vec.single_action_space.shape[0]))
    frame = vec.render()
    torch.testing.assert_close(vec.cube.get_pos(), start, atol=1e-3, rtol=0)
    vec.close()
    assert frame.shape == (360, 480, 3) and frame.dtype == np.uint8
    red = (frame[..., 0] > 150) & (frame[..., 1] < 80) & (frame[..., 2] < 80)
    green = (frame[..., 1] > 120) & (frame[..., 0] < 100) & (frame[..., 2] < 100)
    assert red.sum() > 30 and green.sum() > 10


# Each script on one of the new tasks (all nine pairs cost CI two minutes more and catch nothing these miss).
TASK_OF_SCRIPT = {"ppo_continuous": "FrankaPickCube-v0", "ppo_recurrent": "FrankaPushCubeRandom-v0",
                  "ppo_transformer": "FrankaReachCue-v0"}


def test_each_script_trains_logs_and_evaluates_a_new_task(script, in_tmp):
    """Bugs: a script that cannot act in a task (the gripper's 8th action, a preset that does not fit it), or the
    cube tasks' any-time success lost between info and the logs or --eval-checkpoint's report."""
    env_id = TASK_OF_SCRIPT[script.name]
    args = script.args(env_id=env_id, num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1,
                       total_timesteps=8 * 8 * 2, hidden_sizes=(16,), env_kwargs={"max_episode_steps": 5})
    summary = script.module.train(args)
    cube = env_id != "FrankaReachCue-v0"
    for h in summary["history"]:
        assert 0.0 <= h["charts/success_rate"] <= 1.0
        assert ("episode_metrics/success_once" in h) == cube
    result = script.module.evaluate(summary["checkpoint"], episodes=3, device="cpu", sim_device="cpu")
    assert result["episodes"] == 3 and result["mean_length"] == 5.0 and 0.0 <= result["success_rate"] <= 1.0
    if cube:
        assert result["success_rate"] <= result["success_once"] <= 1.0


def test_a_resumed_genesis_run_continues_exactly_like_the_uninterrupted_one(script, in_tmp):
    """Bug: a run stopped and resumed on a Genesis task drifts from the uninterrupted one (the simulator's warm
    starts and link poses not saved): the same seed, then another run after a preemption, as if the seed changed."""
    args = script.args(env_id=TASK_OF_SCRIPT[script.name], num_envs=8, num_steps=8, num_minibatches=2,
                       update_epochs=1, total_timesteps=8 * 8 * 4, hidden_sizes=(16,), checkpoint_interval=2,
                       env_kwargs={"max_episode_steps": 5})
    straight = script.module.train(args)
    midpoint = os.path.join(straight["run_dir"], "checkpoint_000002.pt")
    resumed = script.module.train(script.module.Args(resume=midpoint, progress_bar=False))
    assert [h["iteration"] for h in resumed["history"]] == [3, 4]
    assert metrics_without_timing(resumed["history"]) == metrics_without_timing(straight["history"][2:])


STACK_OF_SCRIPT = {"ppo_continuous": "FrankaStackCubeRandom-v0", "ppo_recurrent": "FrankaStackCube-v0",
                   "ppo_transformer": "FrankaStackCubeRandom-v0"}


def test_the_stack_stages_reach_the_logs_and_the_evaluation_report(script, in_tmp):
    """Bugs: a stacking preset that does not fit the task (the transformer's history on the randomised stack), the
    stage metrics lost between info and TensorBoard/W&B or --eval-checkpoint's report, the randomised stack's critic
    observation not reaching a privileged critic, or benchmarks/stack_probe.py unable to run a script's checkpoint."""
    env_id = STACK_OF_SCRIPT[script.name]
    args = script.args(env_id=env_id, num_envs=8, num_steps=8, num_minibatches=2, update_epochs=1,
                       total_timesteps=8 * 8 * 2, hidden_sizes=(16,), env_kwargs={"max_episode_steps": 5},
                       **({"privileged_critic": True} if script.name == "ppo_continuous" else {}))
    summary = script.module.train(args)
    for h in summary["history"]:
        assert 0.0 <= h["episode_metrics/stage"] <= 3.0
        assert 0.0 <= h["episode_metrics/reached_stacked"] <= h["episode_metrics/reached_grasped"] <= 1.0
    result = script.module.evaluate(summary["checkpoint"], episodes=3, device="cpu", sim_device="cpu")
    assert result["episodes"] == 3 and 0.0 <= result["stage"] <= 3.0 and "reached_grasped" in result
    probed = stack_probe.main(stack_probe.Args(checkpoint=summary["checkpoint"], num_envs=2, open_after=1,
                                               report_every=1))  # the policy and its memory, as deployed
    assert probed["episodes"] == 2 and len(probed["rows"]) == 4 and 0.0 <= probed["solved"] <= 1.0
    assert ("solved_by_table_friction" in probed) == (env_id == "FrankaStackCubeRandom-v0")  # each drawn quantity


@pytest.mark.parametrize("env_id,kwargs,match", [
    ("FrankaReachCue-v0", {"cue_steps": 0}, "cue_steps"),
    ("FrankaReachCue-v0", {"still_speed_scale": -0.3}, "still_speed_scale must be positive"),
    ("FrankaReachCue-v0", {"cue_step": 3}, "no option 'cue_step'; its options are: .*cue_steps.*success_threshold"),
    ("FrankaPushCube-v0", {"goal_radius": 0.0}, "goal_radius"),
    ("FrankaPickCube-v0", {"decimation": 0}, "decimation"),
    ("FrankaPickCube-v0", {"still_speed_scale": 0.0}, "still_speed_scale must be positive"),
    ("FrankaStackCube-v0", {"cube_area_half_size": (0.05, 0.2)}, "cube_area_half_size"),
    ("FrankaPickCube-v0", {"cube_x_range": (0.6, 0.4)}, r"cube_x_range must be \(low, high\) with low <= high"),
    ("FrankaPickCube-v0", {"goal_height_range": (0.3, 0.05)}, "goal_height_range"),
    ("FrankaPushCube-v0", {"goal_y_range": (0.1, -0.1)}, "goal_y_range"),
    ("FrankaPushCubeRandom-v0", {"table_friction_range": 0.5}, r"table_friction_range must be a \(low, high\) pair"),
    ("FrankaStackCubeRandom-v0", {"cube_mass_range": (0.0, 0.1)}, "cube_mass_range must be positive"),
    ("FrankaReachDelay-v0", {"max_action_delay": 1.5}, "max_action_delay must be a non-negative integer"),
    ("FrankaReachDelay-v0", {"min_action_delay": -1}, "min_action_delay must be a non-negative integer"),
    ("FrankaReachDelay-v0", {"min_action_delay": 4}, "min_action_delay must be at most max_action_delay"),
])
def test_bad_arguments_raise_clear_errors(env_id, kwargs, match):
    """Bugs: a misspelt option answered with only the variant's own options (not its parent's), or a bad value
    that builds a scene anyway."""
    with pytest.raises(ValueError, match=match):
        envs.make(env_id, num_envs=2, **CPU, **kwargs)


# ---------------------------------------------------------------- the critic's observation (docs/design.md §3)
def test_the_cue_task_critic_sees_the_target_at_every_step_and_its_own_final_one(scenes):
    """Bugs: the critic as blind as the policy once the cue is gone (the target zeroed in its observation too),
    or its final observation taken after the autoreset (the next episode's target)."""
    cue = scenes["FrankaReachCue-v0"]
    assert cue.single_critic_observation_space.shape == (33,)
    obs, info = cue.reset(seed=20)
    cue.episode_step[:] = torch.tensor([0, 1, 2, 3])
    ended = 0
    for action in actions(cue, EPISODE + 2, seed=20, scale=0.3):
        torch.testing.assert_close(info["critic_obs"][:, 20:23], cue.target_pos)  # seen whatever the cue
        torch.testing.assert_close(info["critic_obs"][:, :20], obs[:, :20])
        target = cue.target_pos.clone()
        obs, _, _, truncated, info = cue.step(action)
        torch.testing.assert_close(info["final_critic_obs"][:, 20:23], target)
        torch.testing.assert_close(info["final_critic_obs"][:, :20], info["final_obs"][:, :20])
        ended += int(truncated.sum())
    assert ended == 4 and (obs[:, 33] == 0).any()  # every env's episode ended once; some targets were hidden


def test_the_delay_task_critic_sees_the_delay_and_the_actions_in_flight_and_the_policy_does_not(scenes):
    """Bugs: the critic as blind as the policy to the delay, actions that already moved the arm counted as in
    flight, or the delay leaking into the policy's observation (FrankaReach-v0's 33 numbers)."""
    delayed = scenes["FrankaReachDelay-v0"]
    assert delayed.single_critic_observation_space.shape == (33 + 1 + 3 * 7,)
    delayed.reset(seed=31)
    delayed.action_delay[:] = torch.tensor([0, 1, 2, 3])
    sent = actions(delayed, 3, seed=31)
    for action in sent:
        obs, _, _, _, info = delayed.step(action)
    critic = info["critic_obs"]
    torch.testing.assert_close(critic[:, :33], obs)
    assert critic[:, 33].tolist() == [0.0, 1.0, 2.0, 3.0]
    newest_first = torch.stack(sent[::-1], dim=1)  # (envs, 3 steps, 7)
    for env, delay in enumerate(range(4)):
        in_flight = critic[env, 34:].reshape(3, 7)
        torch.testing.assert_close(in_flight[:delay], newest_first[env, :delay])
        assert (in_flight[delay:] == 0).all()


@pytest.mark.parametrize("env_id", DRAWN)
def test_the_randomised_cube_task_critic_sees_the_drawn_mass_and_frictions(scenes, env_id):
    """Bugs: the critic as blind as the policy to the dynamics drawn, or a draw of another env or episode."""
    rand = scenes[env_id]
    assert scenes[env_id.replace("Random", "")].single_critic_observation_space is None
    obs, info = rand.reset(seed=21)
    torch.testing.assert_close(info["critic_obs"], torch.cat([obs, rand.dynamics], dim=-1))
    rand.episode_step[:] = EPISODE - 1  # every episode ends on the next step: new draws
    before = rand.dynamics.clone()
    obs, _, _, truncated, info = rand.step(torch.zeros(4, rand.single_action_space.shape[0]))
    assert truncated.all() and not torch.allclose(rand.dynamics, before)
    torch.testing.assert_close(info["critic_obs"], torch.cat([obs, rand.dynamics], dim=-1))
    torch.testing.assert_close(info["final_critic_obs"], torch.cat([info["final_obs"], before], dim=-1))


def test_the_fine_place_term_is_steep_near_the_goal_and_paid_only_while_grasped(scenes, monkeypatch):
    """Bugs: the fine-grained goal term (`place_fine_weight`, Isaac Lab's lift: 1 - tanh(d / 0.05)) at the coarse
    term's scale, paid for a cube lying on the table, or left out of the reward; off by default."""
    pick = scenes["FrankaPickCube-v0"]
    pick.reset(seed=4)
    assert "place_fine" not in pick.step(torch.zeros(4, 8))[4]["reward_terms"]  # the task unchanged by default
    monkeypatch.setitem(pick.weights, "place_fine", 2.0)
    close = torch.zeros(4, 8)
    close[:, 7] = -1.0
    pick.cube.set_pos(pick.ee_pos[:2], envs_idx=torch.tensor([0, 1]))  # two cubes between the open fingers
    grasped_seen = False
    for _ in range(6):
        _, reward, _, _, info = pick.step(close)
        distance = pick.cube_to_goal.norm(dim=-1)
        expected = 2.0 * (1 - torch.tanh(distance / 0.05)) * pick.grasped.float()
        torch.testing.assert_close(info["reward_terms"]["place_fine"], expected)
        torch.testing.assert_close(sum(info["reward_terms"].values()), reward)
        grasped_seen |= bool(pick.grasped[:2].any())
        assert (info["reward_terms"]["place_fine"][~pick.grasped] == 0).all()
    assert grasped_seen and not pick.grasped[2:].any()  # the other cubes lie on the table, unpaid


@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_the_still_term_follows_its_speed_scale_and_is_paid_only_at_the_goal(scenes, monkeypatch, scale):
    """Bugs: `still_speed_scale` ignored (the term stuck at one scale), the default back at ManiSkill's 5 (flat where
    a trained arm sits at the goal at 1-2 rad/s: 64% success at 5M steps against 98% at 1), or stillness paid away
    from the goal."""
    pick = scenes["FrankaPickCube-v0"]
    assert pick.still_speed_scale == 1.0
    monkeypatch.setattr(pick, "still_speed_scale", scale)
    pick.reset(seed=5)
    pick.cube.set_pos(pick.goal_pos[:2], envs_idx=torch.tensor([0, 1]))  # two cubes at the goal, falling from it
    action = torch.zeros(4, 8)
    action[:, 0] = 1.0  # the arm moving
    _, reward, _, _, info = pick.step(action)
    placed = pick.cube_to_goal.norm(dim=-1) < pick.goal_threshold
    assert placed[:2].all() and not placed[2:].any() and (pick.qd.norm(dim=-1) > 0.05).all()
    expected = (1 - torch.tanh(scale * pick.qd.norm(dim=-1))) * placed
    torch.testing.assert_close(info["reward_terms"]["still"], expected)
    assert (expected[:2] > 0).all()
    torch.testing.assert_close(sum(info["reward_terms"].values()), reward)


# ---------------------------------------------------------------- stacking (ManiSkill3's StackCube-v1)
def test_stack_cubes_reset_apart_upright_at_rest_in_the_documented_area(scenes):
    """Bugs: the two cubes reset overlapping (the simulator throws them apart: a first step no policy caused), B drawn
    without A's position in mind, cubes outside the documented area, or in the air."""
    stack = scenes["FrankaStackCube-v0"]
    a, b = stack._draw_cube_positions(20_000)  # overlapping without the redraws: about 1 draw in 7
    assert ((b - a)[:, :2].norm(dim=-1) >= CUBE_SEPARATION - 1e-6).all()
    for cube in (a, b):
        assert ((cube[:, 0] >= 0.3) & (cube[:, 0] <= 0.7) & (cube[:, 1].abs() <= 0.3)).all()
        assert (cube[:, 2] == CUBE_HALF_SIZE).all()
    both = torch.cat([a, b])[:, :2]
    assert both[:, 0].min() < 0.32 and both[:, 0].max() > 0.68 and both[:, 1].abs().max() > 0.28  # the whole area
    cramped = stack.area_half.clone()
    stack.area_half[:] = 0.03  # an area where redrawing nearly always fails: the pair is moved apart instead
    try:
        a, b = stack._draw_cube_positions(5_000)
    finally:
        stack.area_half[:] = cramped
    assert ((b - a)[:, :2].norm(dim=-1) >= CUBE_SEPARATION - 1e-6).all()
    stack.reset(seed=31)
    start = torch.cat([stack.cube.get_pos(), stack.cube_b.get_pos()])
    assert torch.allclose(start[:, 2], torch.full((8,), CUBE_HALF_SIZE))
    for _ in range(5):  # nothing moves the cubes but the arm, which stays near home
        stack.step(torch.zeros(4, 8))
    torch.testing.assert_close(torch.cat([stack.cube.get_pos(), stack.cube_b.get_pos()]), start, atol=1e-3, rtol=0)


def hold_a_on_b(stack, envs_idx, grip_offset=torch.zeros(3)):
    """The gripper pointing down around the spot on top of B (Genesis's inverse kinematics, the arm put there at rest,
    fingers open) with A in it, for the envs in `envs_idx`; the fingertip point `grip_offset` away from A's centre."""
    import genesis as gs

    top_of_b = stack.cube_b.get_pos()[envs_idx] + torch.tensor((0.0, 0.0, 2 * CUBE_HALF_SIZE))
    down = torch.tensor((0.0, 1.0, 0.0, 0.0), device=gs.device).expand(len(envs_idx), 4)
    q = stack.robot.inverse_kinematics(link=stack.hand, pos=top_of_b + grip_offset, quat=down, local_point=TCP_OFFSET,
                                       envs_idx=envs_idx)
    q[:, 7:] = 0.04
    stack.robot.set_qpos(q, envs_idx=envs_idx, zero_velocity=True)
    stack.arm_target[envs_idx] = q[:, :7]
    stack.cube.set_pos(top_of_b, envs_idx=envs_idx)


def test_stack_success_needs_a_on_b_still_and_released(scenes):
    """Bugs: success counted while A is still held (the robot must let go), with A beside B, or A moving; the stage
    not the highest condition met; the episode's stage metrics forgetting a stage reached earlier (or A's nearest
    approach to B, its highest point or the gripper opened on B forgotten when A is knocked off)."""
    stack = scenes["FrankaStackCube-v0"]
    stack.reset(seed=32)
    hold_a_on_b(stack, torch.tensor([0, 1]))
    top_of_b = stack.cube_b.get_pos()[2:3] + torch.tensor((0.0, 0.0, 2 * CUBE_HALF_SIZE))
    stack.cube.set_pos(top_of_b, envs_idx=torch.tensor([2]))  # env 2: A set down on B, the arm far off
    close = torch.zeros(4, 8)
    close[:, 7] = -1.0
    for _ in range(4):  # envs 0 and 1 squeeze A on top of B
        stack.step(close)
    assert stack.grasped.tolist() == [True, True, False, False] and stack.held.tolist() == [True, True, False, False]
    assert stack.stage.tolist() == [2, 2, 3, 0] and stack.solved.tolist() == [False, False, True, False]
    assert (stack.cube_vel.norm(dim=-1) < 0.01).all()  # held still: only the grasp stands between A and success
    release = torch.zeros(4, 8)
    release[:, 7] = 1.0
    release[1, 7] = -1.0  # env 0 lets go; env 1 keeps squeezing
    for _ in range(4):
        stack.step(release)
    assert stack.stage.tolist() == [3, 2, 3, 0]
    stack.cube.set_pos(stack.cube.get_pos()[:1] + torch.tensor((0.1, 0.0, 0.0)), envs_idx=torch.tensor([0]))
    for _ in range(EPISODE - 8):  # env 0's A knocked off B before the end: solved once, not at the end
        _, _, _, truncated, info = stack.step(release)
    assert truncated.all()
    assert info["success"].tolist() == [False, False, True, False]
    metrics = info["episode_metrics"]
    assert metrics["success_once"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert metrics["stage"].tolist() == [3.0, 2.0, 3.0, 0.0]
    assert metrics["reached_grasped"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert metrics["reached_stacked"].tolist() == [1.0, 1.0, 1.0, 0.0]
    closest = metrics["closest_to_b"]  # the nearest A came to the top of B: on it for 0-2, never for 3
    assert (closest[:3] < 0.005).all() and closest[3] > 0.06 and torch.isfinite(closest).all()
    lift = metrics["lift"]  # how high A rose: onto B (its centre 4 cm up) for 0-2, resting for 3
    assert (lift[:3] > 0.035).all() and lift[3].abs() < 0.005
    assert (stack.lift == 0).all()  # the episodes that started on the last step start from nothing
    # The gripper opened with A on B: env 0 let go, env 2 opened (the arm far off); env 1 squeezed to the end, env 3's
    # A never reached B.
    assert metrics["released_on_b"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert not stack.released_on_b.any()


def test_a_squeezed_off_centre_on_b_is_held_until_the_gripper_opens(scenes):
    """Bug: the stacking policy on ManiSkill3's settings was paid for success at 13M steps without ever opening the
    gripper: it squeezed A off-centre, A's centre 2.0-2.4 cm from the fingertip point, where the nearness test (within
    2 cm) says not grasped. Letting go must end `held`: the gripper closing with A grasped or touching a finger."""
    stack = scenes["FrankaStackCube-v0"]
    stack.reset(seed=35)
    hold_a_on_b(stack, torch.tensor([0]))
    hold_a_on_b(stack, torch.tensor([1]), grip_offset=torch.tensor((0.021, 0.0, 0.016)))  # along the finger pads, up
    close = torch.zeros(4, 8)
    close[:, 7] = -1.0
    for _ in range(4):
        stack.step(close)
    assert stack.to_cube[0].norm() < 0.01 and stack.to_cube[1].norm() > 0.02  # env 1 outside the nearness test
    assert stack.grasped[:2].tolist() == [True, False] and stack.held[:2].tolist() == [True, True]
    assert stack.stage[:2].tolist() == [2, 2]
    assert (stack.cube_vel[:2].norm(dim=-1) < 0.01).all()  # held still: the grasp alone keeps it from success
    release = torch.zeros(4, 8)
    release[:, 7] = 1.0
    for _ in range(4):
        stack.step(release)
    assert stack.held[:2].tolist() == [False, False] and stack.stage[:2].tolist() == [3, 3]


def test_holding_a_on_b_pays_more_the_further_the_gripper_is_commanded_open(scenes):
    """Bug: the release term paid the fingers' reached opening, which A blocks at its width whatever the squeeze: no
    gradient towards letting go, and the stacking policy held A on B at a gripper action of -0.85 (std 0.16) for 13M
    steps without once sampling an opening. While held it pays the commanded opening; let go, all of it."""
    stack = scenes["FrankaStackCube-v0"]
    stack.reset(seed=36)
    hold_a_on_b(stack, torch.arange(4))
    squeeze = torch.zeros(4, 8)
    squeeze[:, 7] = torch.tensor((-1.0, -0.6, -0.3, -0.1))
    for _ in range(6):
        _, _, _, _, info = stack.step(squeeze)
    assert stack.held.all() and (stack.stage == 2).all()
    torch.testing.assert_close(stack.fingers.sum(-1), torch.full((4,), 2 * CUBE_HALF_SIZE), atol=2e-3, rtol=0)
    release = info["reward_terms"]["release"]
    torch.testing.assert_close(release, 0.0625 * (squeeze[:, 7] + 1) / 2)  # 0.5 of the term at A's width
    squeeze[:, 7] = 1.0
    for _ in range(4):
        _, _, _, _, info = stack.step(squeeze)
    assert not stack.held.any()
    torch.testing.assert_close(info["reward_terms"]["release"], torch.full((4,), 0.0625))


def test_the_stack_probe_opens_the_gripper_after_the_steps_on_b_asked_and_keeps_it_open():
    """Bugs in benchmarks/stack_probe.py's forced release: an env opened a step early or late, reclosed once A leaves
    B, the policy's own action changed in place, or the arm held where --freeze-arm was not given (or moved where it
    was)."""
    policy_action = torch.full((4, 8), -0.5)
    on_b_steps = torch.tensor((3, 2, 0, 0))
    opened = torch.tensor((False, False, False, True))  # env 3 opened earlier, A since knocked off B
    action, now_opened = stack_probe.force_release(policy_action, on_b_steps, opened, 3, freeze_arm=False)
    assert now_opened.tolist() == [True, False, False, True]
    assert action[:, 7].tolist() == [1.0, -0.5, -0.5, 1.0] and (action[:, :7] == -0.5).all()
    assert (policy_action == -0.5).all()
    action, _ = stack_probe.force_release(policy_action, on_b_steps, opened, 3, freeze_arm=True)
    assert (action[[0, 3], :7] == 0).all() and (action[[1, 2], :7] == -0.5).all()
    action, never = stack_probe.force_release(policy_action, torch.full((4,), 50), torch.zeros(4, dtype=torch.bool), 0,
                                              freeze_arm=True)
    assert not never.any() and (action == policy_action).all()


class DriftingStack:
    """A stand-in for the randomised stacking task as the probe reads it: A on B from the first step, sliding 4 mm
    further off B's centre every step, upright and still; env 0's A light and solved at the end, env 1's heavy and not;
    the last step's autoreset draws the next episodes' masses (swapped)."""
    num_envs, max_episode_steps = 2, 6
    dynamics_names, dynamics_low, dynamics_high = ("cube_mass",), torch.tensor([0.02]), torch.tensor([0.15])

    def __init__(self):
        self.cube_pos, self.cube_b_pos = torch.zeros(2, 3), torch.zeros(2, 3)
        self.cube_quat = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 2)
        self.cube_vel, self.cube_ang = torch.zeros(2, 3), torch.zeros(2, 3)
        self.stage, self.held = torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool)
        self.dynamics, self.steps = torch.tensor([[0.03], [0.14]]), 0

    def step(self, action):
        self.cube_pos[:, 0] += 0.004
        self.stage[:] = 2
        self.steps += 1
        if self.steps == self.max_episode_steps:
            self.dynamics = self.dynamics.flip(0)
        ones, no = torch.ones(2), torch.zeros(2, dtype=torch.bool)
        metrics = {"success_once": ones, "reached_stacked": ones, "released_on_b": ones}
        return torch.zeros(2, 4), torch.zeros(2), no, no, {"episode_metrics": metrics, "success": torch.tensor([1, 0])}


def test_the_stack_probe_bins_an_opening_by_where_a_was_when_it_opened():
    """Bug: A's offset and tilt taken again at every step after the opening (the bins then say where A ended up, not
    where the hold was let go of)."""
    args = stack_probe.Args(checkpoint="unused", open_after=1, report_every=3)
    result = stack_probe.probe(DriftingStack(), torch.zeros(2, 4), lambda obs: torch.zeros(2, 8), args)
    assert result["opened"] == 1.0 and result["rows"][-1]["offset_m"] > 0.02  # A slid 24 mm off by the end
    first = result["solved_by_offset_m"][0]  # opened after one step on B, 4 mm off B's centre
    assert (first["low"], first["high"], first["episodes"]) == (0.0, 0.005, 2)


def test_the_stack_probe_bins_an_opening_by_the_masses_drawn_for_its_episode():
    """Bugs: the randomised task's outcomes binned by the masses the last step's autoreset drew for the next episodes,
    or by a range's halves put the wrong way round."""
    args = stack_probe.Args(checkpoint="unused", open_after=1, report_every=3)
    light, heavy = stack_probe.probe(DriftingStack(), torch.zeros(2, 4), lambda obs: torch.zeros(2, 8),
                                     args)["solved_by_cube_mass"]
    assert (light["high"], light["episodes"], light["solved"]) == (pytest.approx(0.085), 1, 1.0)
    assert (heavy["high"], heavy["episodes"], heavy["solved"]) == (pytest.approx(0.15), 1, 0.0)


def test_the_stack_probe_lets_go_of_a_held_on_b_and_reports_it_solved(scenes):
    """Bug: the probe's forced opening not reaching the task (a policy holding A on B counted as let go, or the opened
    episodes not solved where A sits centred on B), or the outcome put in the wrong offset bin."""
    stack = scenes["FrankaStackCube-v0"]
    squeeze = torch.zeros(4, 8)
    squeeze[:, 7] = -1.0
    results = {}
    for open_after in (0, 3):
        obs, _ = stack.reset(seed=37)
        hold_a_on_b(stack, torch.tensor([0, 1]))  # envs 2 and 3: A on the table, never on B
        args = stack_probe.Args(checkpoint="unused", open_after=open_after, report_every=3)
        results[open_after] = stack_probe.probe(stack, obs, lambda _: squeeze, args)
    held, let_go = results[0], results[3]
    assert held["opened"] == 0.0 and held["released_on_b"] == 0.0 and held["solved"] == 0.0
    assert held["rows"][0]["on_b"] == 0.5 and held["rows"][0]["held_on_b"] == 1.0
    assert let_go["opened"] == 0.5 and let_go["released_on_b"] == 0.5 and let_go["solved"] == 0.5
    assert let_go["rows"][0]["opened"] == 0.0 and let_go["rows"][1]["opened"] == 0.5  # opened at the 4th step
    centred = let_go["solved_by_offset_m"][0]
    assert (centred["low"], centred["episodes"], centred["solved"]) == (0.0, 2, 1.0)
    assert sum(entry["episodes"] for entry in let_go["solved_by_tilt_deg"]) == 2


def test_stack_reward_is_maniskills_staged_reward_normalised_and_its_terms_add_up(scenes):
    """Bugs: a stage paying less than the one below it (the policy unlearns a stage to stay in a cheaper one), a term
    unbounded or of the wrong sign, a term left out of the sum, the top stage not 1 (ManiSkill3's 8, normalised)."""
    stack = scenes["FrankaStackCube-v0"]
    weights = {"reach": 0.25, "grasp": 0.25, "place": 0.125, "stack": 0.125, "release": 0.0625, "still": 0.0625,
               "success": 0.125}
    bands = {0: (0.0, 0.25), 1: (0.5, 0.625), 2: (0.75, 0.875), 3: (1.0, 1.0)}  # ManiSkill3's (0-2, 4-5, 6-7, 8) / 8
    seen_stages = set()
    stack.reset(seed=33)
    hold_a_on_b(stack, torch.tensor([0]))
    close = torch.zeros(4, 8)
    close[:, 7] = -1.0
    for step, action in enumerate(actions(stack, EPISODE - 1, seed=33, scale=0.2)):
        action[0] = close[0] if step < 4 else -close[0]  # env 0: hold A on B, then let go
        action[1:, 7] = 1.0
        _, reward, _, _, info = stack.step(action)
        terms = info["reward_terms"]
        assert set(terms) == set(weights) | {"table_contact", "action_rate"}
        torch.testing.assert_close(sum(terms.values()), reward)
        staged = sum(terms[name] for name in weights)
        for name, weight in weights.items():
            assert ((terms[name] >= 0) & (terms[name] <= weight + 1e-6)).all(), name
        assert (terms["table_contact"] <= 0).all() and (terms["table_contact"] >= -0.5 / 8).all()
        assert (terms["action_rate"] <= 0).all()
        for stage, value in zip(stack.stage.tolist(), staged.tolist()):
            low, high = bands[stage]
            assert low - 1e-6 <= value <= high + 1e-6, (stage, value)
            seen_stages.add(stage)
    assert seen_stages == {0, 2, 3}  # stage 1 (carrying) is the scripted stack's (test below)


def test_a_scripted_stack_climbs_every_stage_and_is_solved(scenes):
    """Bug: a task no policy can solve (A cannot be grasped, carried or let go of on B with the task's gains, or the
    stages never fire), or a reward that does not rise stage by stage. The arm follows Genesis's inverse kinematics
    above A, down, closes, carries A above B, settles it 2 cm over B, lowers it, opens, and lifts away (100 steps,
    the task's own actions)."""
    import genesis as gs

    stack = envs.make("FrankaStackCube-v0", num_envs=4, seed=34, max_episode_steps=100, **CPU)
    stack.reset()
    down = torch.tensor((0.0, 1.0, 0.0, 0.0), device=gs.device).expand(4, 4)
    above = torch.tensor((0.0, 0.0, 0.08))
    # A hovers 2 cm over B before it is lowered: lowered straight from 8 cm, A arrives tilted and off-centre on some
    # CPUs' rounding and tumbles off B when let go.
    hover = torch.tensor((0.0, 0.0, 0.02))
    best_reward = {}
    for step in range(100):
        a, top_of_b, held_offset = stack.cube_pos, stack.goal_pos, stack.ee_pos - stack.cube_pos
        target, gripper = ((a + above, 1.0) if step < 15 else (a, 1.0) if step < 25 else (a, -1.0) if step < 30
                           else (top_of_b + above + held_offset, -1.0) if step < 50
                           else (top_of_b + held_offset + hover, -1.0) if step < 58
                           else (top_of_b + held_offset + torch.tensor((0.0, 0.0, 0.002)), -1.0) if step < 70
                           else (stack.ee_pos, 1.0) if step < 76 else (a + torch.tensor((0.0, 0.0, 0.1)), 1.0))
        q = stack.robot.inverse_kinematics(link=stack.hand, pos=target, quat=down, local_point=TCP_OFFSET)
        action = torch.zeros(4, 8)
        action[:, :7] = ((q[:, :7] - stack.arm_target) / stack.action_scale).clamp(-1, 1)
        action[:, 7] = gripper
        _, reward, _, truncated, info = stack.step(action)
        for stage, value in zip(stack.stage.tolist(), reward.tolist()):
            best_reward[stage] = max(best_reward.get(stage, -1.0), value)
    stack.close()
    assert truncated.all() and info["success"].all()
    assert info["episode_metrics"]["stage"].tolist() == [3.0] * 4
    assert (info["episode_metrics"]["lift"] > 0.04).all()  # carried 8 cm over B's top
    assert info["episode_metrics"]["released_on_b"].tolist() == [1.0] * 4
    assert best_reward[0] < best_reward[1] < best_reward[2] < best_reward[3] <= 1.0
