"""The envs/ contract on the Genesis task FrankaReach-v0 (CPU backend, a few envs).

Each Genesis scene build takes several seconds (the first one in a fresh cache compiles kernels for
over a minute), so the scenes are module fixtures shared by the tests that only read them.
"""

import copy
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs
from conftest import REPO, SCRIPTS, SLOW_MACHINE_S, check_episode_statistics, check_seeding, script_named
from envs.franka import FrankaReachVecEnv

EPISODE = 10


def actions(num_envs, steps, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [scale * (2 * torch.rand(num_envs, 7, generator=g) - 1) for _ in range(steps)]


@pytest.fixture(scope="module")
def short_and_long():
    """Two single-env scenes, same seed, episodes of EPISODE and 3*EPISODE steps, no staggering."""
    kwargs = dict(num_envs=1, seed=7, sim_device="cpu", stagger_episodes=False)
    short = envs.make("FrankaReach-v0", max_episode_steps=EPISODE, **kwargs)
    long = envs.make("FrankaReach-v0", max_episode_steps=3 * EPISODE, **kwargs)
    yield short, long
    short.close()
    long.close()


@pytest.fixture(scope="module")
def batch():
    vec = gym.make_vec("FrankaReach-v0", num_envs=4, seed=0, sim_device="cpu", max_episode_steps=20)
    yield vec
    vec.close()


def test_registered_vector_entry_point_builds_the_native_batched_env(batch):
    """Bug: gym.make_vec wraps the Genesis task in a per-env SyncVectorEnv (or fails) instead."""
    assert isinstance(batch, FrankaReachVecEnv)
    obs, _ = batch.reset(seed=0)
    assert obs.shape == (4, 33) and obs.dtype == torch.float32 and obs.device.type == "cpu"
    assert batch.single_action_space.shape == (7,)


def test_final_obs_is_the_last_obs_of_the_truncated_episode(short_and_long):
    """Bug: bootstrapping a time-limited episode from the reset observation (new target, home pose)."""
    short, long = short_and_long
    short_obs, _ = short.reset(seed=7)
    long_obs, _ = long.reset(seed=7)
    torch.testing.assert_close(short_obs, long_obs)
    for t, action in enumerate(actions(1, EPISODE, scale=0.5)):
        short_obs, _, terminated, truncated, info = short.step(action)
        long_obs, _, _, long_truncated, _ = long.step(action)
        assert not terminated.any() and not long_truncated.any()
        assert truncated.item() == (t == EPISODE - 1)
        # The short env's final_obs is what the long env (no reset yet) sees at the same step.
        torch.testing.assert_close(info["final_obs"], long_obs, atol=1e-5, rtol=1e-5)
    assert info["episode"]["mask"].item() and info["episode"]["l"].item() == EPISODE
    # The returned obs already belongs to the next episode: new target, joints at rest near home.
    assert not torch.allclose(short_obs[0, 20:23], long_obs[0, 20:23])  # a new target was drawn
    assert short_obs[0, 7:14].abs().max() < 1e-4  # joint velocities are zero after the reset


def test_novel_variant_hides_exactly_the_joint_and_end_effector_velocities(short_and_long):
    """Bug: the memory task leaks a velocity (or drops a position) and no longer needs memory."""
    short, _ = short_and_long
    novel = envs.make("FrankaReachNoVel-v0", num_envs=1, seed=7, sim_device="cpu", stagger_episodes=False,
                      max_episode_steps=EPISODE)
    assert novel.single_observation_space.shape == (23,)
    keep = [i for i in range(33) if not (7 <= i < 14 or 17 <= i < 20)]
    full_obs, _ = short.reset(seed=11)
    novel_obs, _ = novel.reset(seed=11)
    for action in actions(1, 4, seed=3):
        torch.testing.assert_close(novel_obs, full_obs[:, keep], atol=1e-5, rtol=1e-5)
        full_obs, (novel_obs, *_, novel_info) = short.step(action)[0], novel.step(action)
        # the critic sees FrankaReach-v0's whole observation, the hidden velocities included
        torch.testing.assert_close(novel_info["critic_obs"], full_obs, atol=1e-5, rtol=1e-5)
    assert full_obs[:, 7:14].abs().max() > 1e-3  # the hidden entries did carry motion
    assert novel.single_critic_observation_space.shape == (33,) and short.single_critic_observation_space is None
    novel.close()


def test_same_seed_reproduces_the_trajectory_and_another_seed_does_not(short_and_long):
    """Bug: targets or initial poses drawn from an unseeded generator."""
    short, long = short_and_long
    check_seeding([(short, 3), (long, 3), (long, 4)], actions(1, 5, seed=1), atol=1e-6)


def test_observed_previous_action_is_the_action_just_applied(batch):
    """Bug: the observation shows the action from two steps ago (updated after observing)."""
    batch.reset(seed=9)
    for action in actions(4, 3, seed=9, scale=0.5):
        info = batch.step(action)[-1]
        # final_obs: an env whose (staggered) episode ends on this step has already been reset in the returned obs.
        torch.testing.assert_close(info["final_obs"][:, 26:33], action)


def test_episode_statistics_are_raw_and_success_only_at_episode_end(batch):
    """Bug: returns that are not the sum of raw rewards, or success reported mid-episode."""
    batch.reset(seed=1)

    def reaching_checks(terminated, truncated, info):
        assert not terminated.any()  # reaching has no terminal state
        assert not (info["success"] & ~truncated).any()

    assert check_episode_statistics(batch, actions(4, 45, seed=2, scale=0.3), reaching_checks) >= 8


def test_first_episodes_are_staggered_so_envs_do_not_truncate_together(batch):
    """Bug: all envs end on the same step, so each short rollout sees only one phase of the episode."""
    batch.seeded = False  # the next reset counts as the first one, as after make
    batch.reset(seed=3)
    end_steps = set()
    for t, action in enumerate(actions(4, 20)):
        truncated = batch.step(action)[3]
        end_steps.update((t, i) for i in truncated.nonzero().flatten().tolist())
    assert len({t for t, _ in end_steps}) > 1


def test_reward_terms_are_finite_sum_to_the_reward_and_have_the_documented_signs(batch):
    """Bug: a reward term with the wrong sign (rewarding jerky motion) or one left out of the sum."""
    batch.reset(seed=4)
    seen = {}
    for action in actions(4, 30, seed=5):
        _, reward, _, _, info = batch.step(action)
        terms = info["reward_terms"]
        assert set(terms) == {"distance", "success_bonus", "action_rate", "joint_velocity"}
        torch.testing.assert_close(sum(terms.values()), reward)
        for name, value in terms.items():
            assert torch.isfinite(value).all()
            seen.setdefault(name, []).append(value)
    seen = {name: torch.cat(values) for name, values in seen.items()}
    assert (seen["distance"] < 0).all()
    assert (seen["success_bonus"] >= 0).all()
    assert (seen["action_rate"] <= 0).all() and (seen["action_rate"] < 0).any()
    assert (seen["joint_velocity"] <= 0).all() and (seen["joint_velocity"] < 0).any()


def test_the_still_term_pays_for_resting_inside_the_ball_only_and_is_off_by_default(batch):
    """Bugs: `still_weight` or `still_speed_scale` not reaching the reward (or not passed through a variant's
    constructor), the term paid outside the 2-cm ball or growing with speed, or FrankaReach-v0's reward changed by
    default."""
    batch.reset(seed=4)
    assert "still" not in batch.step(torch.zeros(4, 7))[4]["reward_terms"]
    cue = envs.make("FrankaReachCue-v0", num_envs=4, seed=0, sim_device="cpu", still_weight=0.5,
                    still_speed_scale=0.3)
    try:
        cue.reset(seed=1)
        cue.step(torch.zeros(4, 7))
        cue.target_pos[:2] = cue.ee_pos[:2]  # two fingertips at their targets, two far from theirs
        for action in actions(4, 6, seed=3, scale=0.2):
            action[0] = 0.0  # one arm settling, one moving at its target
            _, reward, _, _, info = cue.step(action)
            still = info["reward_terms"]["still"]
            expected = 0.5 * (1 - torch.tanh(0.3 * cue.qd.norm(dim=-1))) * cue.reached.float()
            torch.testing.assert_close(still, expected)
            torch.testing.assert_close(sum(info["reward_terms"].values()), reward)
            assert cue.reached[0] and not cue.reached[2:].any() and (still[2:] == 0).all()
        assert still[0] > still[1] > 0  # at rest pays more than moving
    finally:
        cue.close()


def test_subset_reset_touches_only_the_masked_envs(batch):
    """Bug: resetting one env moves the others' arms or redraws their targets."""
    batch.reset(seed=5)
    for action in actions(4, 5, seed=6):
        obs = batch.step(action)[0]
    steps_before = batch.episode_step.clone()
    mask = torch.tensor([False, False, True, False])
    new_obs, _ = batch.reset(options={"reset_mask": mask})
    torch.testing.assert_close(new_obs[~mask], obs[~mask])
    assert not torch.allclose(new_obs[2], obs[2])
    assert batch.episode_step[2] == 0 and torch.equal(batch.episode_step[~mask], steps_before[~mask])


@pytest.mark.parametrize("corrupt", ["nan_velocity", "absurd_target"])
def test_nonfinite_or_absurd_state_in_one_env_resets_that_env_only(batch, corrupt):
    """Bug: one diverged arm raises for the whole batch, or poisons the rollout with NaN or with finite but
    absurd values (here a target 1e8 m away: the physics stays finite, the observation does not stay sane)."""
    batch.reset(seed=6)
    obs = batch.step(torch.zeros(4, 7))[0]
    if corrupt == "nan_velocity":
        batch.robot.set_dofs_velocity(torch.full((1, 9), float("nan")), envs_idx=[1])
    else:
        batch.target_pos[1] = 1e8
    new_obs, reward, terminated, truncated, info = batch.step(torch.zeros(4, 7))
    assert info["sim_errors"].tolist() == [False, True, False, False]
    assert truncated[1] and not terminated.any()
    assert new_obs.abs().max() < 1e3 and torch.isfinite(reward).all()
    torch.testing.assert_close(info["final_obs"][1], obs[1])
    for _ in range(12):  # past Genesis's periodic whole-batch error check
        assert torch.isfinite(batch.step(torch.zeros(4, 7))[0]).all()


def test_numpy_actions_from_the_action_space_and_a_wrong_shape(batch):
    """Bugs: `gym.make_vec("FrankaReach-v0").action_space.sample()` (numpy) failing with AttributeError; an action
    of the wrong shape failing inside the simulator."""
    batch.reset(seed=9)
    obs, reward, *_ = batch.step(batch.action_space.sample())
    assert obs.shape == (4, batch.single_observation_space.shape[0]) and torch.isfinite(reward).all()
    with pytest.raises(ValueError, match=r"action must have shape \(4, 7\)"):
        batch.step(torch.zeros(4, 6))


def test_out_of_range_actions_saturate_instead_of_exploding(batch):
    """Bug: an unclipped action drives the joint command far outside its limits."""
    batch.reset(seed=8)
    for _ in range(5):
        _, reward, _, _, info = batch.step(torch.full((4, 7), 50.0))
    assert torch.isfinite(reward).all()
    assert (batch.arm_target >= batch.arm_lower - 1e-6).all() and (batch.arm_target <= batch.arm_upper + 1e-6).all()
    assert (info["reward_terms"]["action_rate"] >= -0.01 * 4 * 7 - 1e-6).all()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"decimation": 0}, "decimation"),
        ({"max_episode_steps": -1}, "max_episode_steps"),
        ({"action_scale": 0.0}, "action_scale"),
        ({"render_mode": "human"}, "render_mode"),
        ({"sim_device": "tpu"}, "sim_device"),
        ({"max_abs_value": 0.0}, "max_abs_value"),
        ({"target_low": (0.3, 0.2)}, r"target_low must be 3 finite numbers \(x, y, z in metres\), got \(0.3, 0.2\)"),
        ({"target_high": (0.6, 0.25, float("nan"))}, "target_high must be 3 finite numbers"),
        ({"target_low": (0.7, -0.25, 0.15)}, "target_low must be at most target_high in each coordinate"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs.make("FrankaReach-v0", num_envs=2, **kwargs)


def test_env_kwargs_sets_the_target_box_from_the_command_line():
    """Bugs: `--env-kwargs target_low 0.4,-0.1,0.2` (a corner: three numbers, one word) left a string the task could
    not use (a traceback from torch.tensor), or parsed into a box the targets are not drawn from."""
    flags = ["--env-id", "FrankaReach-v0", "--sim-device", "cpu",
             "--env-kwargs", "target_low", "0.4,-0.1,0.2", "target_high", "0.55,0.1,0.3"]
    for name in SCRIPTS:
        args = script_named(name).module.parse_args(flags)
        assert args.env_kwargs == {"target_low": (0.4, -0.1, 0.2), "target_high": (0.55, 0.1, 0.3)}, name
    vec = script_named("ppo_continuous").module.make_env(args, 16, seed=1, device=torch.device("cpu"))
    try:
        vec.reset(seed=1)
        low, high = torch.tensor([0.4, -0.1, 0.2]), torch.tensor([0.55, 0.1, 0.3])
        assert ((vec.target_pos >= low - 1e-6) & (vec.target_pos <= high + 1e-6)).all(), vec.target_pos
        assert vec.target_pos.std(0).min() > 0.01  # drawn, not pinned to a corner
    finally:
        vec.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_gpu_simulation_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="sim_device='gpu'.*sim_device='cpu'"):
        envs.make("FrankaReach-v0", num_envs=2, sim_device="gpu")


def test_headless_video_frame_of_env_zero():
    """Bug: --capture-video needs a display, or renders a blank frame."""
    vec = envs.make("FrankaReach-v0", num_envs=2, sim_device="cpu", render_mode="rgb_array")
    vec.reset()
    vec.step(torch.zeros(2, 7))
    frame = vec.render()
    vec.close()
    assert frame.shape == (360, 480, 3) and frame.dtype == np.uint8
    assert frame.std() > 5  # not a blank image


def test_torch_compile_can_build_after_a_genesis_scene():
    """Bug: --compile failed on every Genesis task (an AssertionError naming Python's distutils/core.py): building a
    scene imported Python 3.11's own distutils, and torch.compile's C++ builder, importing setuptools later, refused
    it. A fresh process, as a run is."""
    code = ("import envs; envs.make('FrankaReach-v0', num_envs=1, sim_device='cpu').close(); "
            "import torch.utils.cpp_extension; print('built')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            timeout=SLOW_MACHINE_S)
    assert result.returncode == 0 and "built" in result.stdout, result.stderr[-2000:]


def test_a_state_saved_on_another_kind_of_device_loads_and_goes_on_the_same_way_each_time(batch, capsys):
    """Bug: a GPU run's env state resumed on the CPU (or the reverse) raised mid-resume: a CUDA generator's state
    (16 bytes) does not fit a CPU generator (5056), so the task's random draws could not be restored."""
    batch.reset(seed=3)
    state = batch.state_dict()
    state["generator"] = torch.tensor([42, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)
    draws = []
    for _ in range(2):
        batch.load_state_dict(state)
        draws.append(batch._uniform(3, torch.zeros(2), torch.ones(2)))
    torch.testing.assert_close(draws[0], draws[1])  # a resume repeats itself
    assert "GPU generator's" in capsys.readouterr().out


@pytest.mark.parametrize("written_by", ["another kind of device", "another Genesis"])
def test_a_simulator_state_from_another_device_or_genesis_is_left_out_with_a_note_and_the_joints_restored(
        batch, capsys, written_by):
    """Bugs: Genesis's own arrays saved on a GPU (whose layout may differ where the shapes match) written into a CPU
    scene, or arrays another Genesis version named or shaped otherwise: physics from garbage, or a traceback
    halfway through a resume. Either is left out, saying why, and the joints saved beside it are restored."""
    batch.reset(seed=4)
    for action in actions(4, 3, seed=4):
        batch.step(action)
    state = copy.deepcopy(batch.state_dict())
    arrays = state["simulator"]["arrays"]
    arrays["RigidSolver.dyn_state.dofs.vel"] += 100.0  # what the scene would hold if these were written anyway
    if written_by == "another kind of device":
        state["simulator"]["device"] = "cuda"
    else:
        arrays["RigidSolver.constraint_state.qacc_ws_v2"] = arrays.pop("RigidSolver.constraint_state.qacc_ws")
    for action in actions(4, 2, seed=5):  # away from the saved state
        batch.step(action)
    batch.load_state_dict(state)
    assert "the saved simulator state is left out" in capsys.readouterr().out
    torch.testing.assert_close(batch.robot.get_qpos(), state["qpos"], atol=0, rtol=0)
    torch.testing.assert_close(batch.robot.get_dofs_velocity(), state["dofs_velocity"], atol=0, rtol=0)
    batch.step(torch.zeros(4, batch.single_action_space.shape[0]))  # and it steps on


def test_release_genesis_frees_the_memory_genesis_keeps_of_each_destroyed_scene():
    """Bug: a process that builds scene after scene (the test suite, an evaluation tool, a sweep) grows by what Genesis
    keeps of each destroyed scene (genesis-world#949; 230-330 MiB per 512-env arm scene here): the suite's process
    reached 5.8 GB. release_genesis() must free it by destroying Genesis, and the next env must build and step. A
    fresh process, so that this module's own scenes stay open."""
    code = ("import envs, os, torch\n"
            "def resident():\n"
            "    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20\n"
            "def build_step_close():\n"
            "    env = envs.make('FrankaReach-v0', num_envs=512, seed=0, sim_device='cpu')\n"
            "    env.reset(seed=0); env.step(torch.zeros(512, 7)); env.close(); envs.release_genesis()\n"
            "build_step_close(); first = resident()\n"
            "build_step_close(); build_step_close(); print('grew', resident() - first)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            timeout=SLOW_MACHINE_S)
    assert result.returncode == 0 and "grew" in result.stdout, result.stderr[-2000:]
    grew = float(result.stdout.split("grew")[-1])
    assert grew < 400, f"two more 512-env scenes left {grew:.0f} MiB (kept: 230-330 MiB each; released: under 90)"

