"""The Genesis tasks' steps wait for the GPU only where they must (docs/tasks.md), checked on the CPU.

On a GPU, every read of a device tensor's value on the host (`bool(t)`, `t.item()`, `int(t)`, `t.nonzero()`) and every
Python number or list made into a device tensor (`x[idx] = 0.0`, `torch.tensor(...)`) stops the host until the GPU has
done all queued work: measured on an H200 (benchmarks/results/gpu.md, item 2), these made `envs/` cost more than the
simulator. The ops that do so are the same on the CPU, so a dispatch mode sees them here, by the line of `envs/` that
asked for them."""

import collections
import os
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import envs

ENVS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "envs") + os.sep
# Reading a value on the host, and making a tensor of Python data (a host-to-device copy on a GPU)
HOST_READS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default"}
FROM_PYTHON = {"aten.lift_fresh.default", "aten.lift_fresh_copy.default"}
INDICES = "aten.nonzero.default"  # which envs start again: the one wait a reset needs


class EnvsSyncs(TorchDispatchMode):
    """Counts the syncing ops that a line of `envs/` itself asked for (Genesis's own are not ours to change)."""

    def __init__(self, host_tensors=()):
        super().__init__()
        self.counts = collections.Counter()
        self.host_ptrs = {t.data_ptr() for t in host_tensors}  # tensors kept on the host on purpose

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        syncs = name in FROM_PYTHON or name == INDICES or (
            name in HOST_READS and not (isinstance(args[0], torch.Tensor) and args[0].data_ptr() in self.host_ptrs))
        if syncs:
            torch_dir = f"{os.sep}torch{os.sep}"
            caller = [frame for frame in traceback.extract_stack()[:-1] if torch_dir not in frame.filename]
            if caller and caller[-1].filename.startswith(ENVS_DIR):
                self.counts[(name, f"{os.path.basename(caller[-1].filename)}:{caller[-1].lineno}")] += 1
        return func(*args, **(kwargs or {}))


ROUGH = dict(terrain_levels=3, tile_size=4.0, terrain_border=1.0, max_init_level=2, edge_margin=0.5)


@pytest.mark.parametrize("env_id,kwargs", [
    ("FrankaReachCue-v0", {}),
    ("FrankaReachDelay-v0", {}),
    ("FrankaPushCubeRandom-v0", {}),
    ("FrankaStackCube-v0", {}),
    ("Go2Walk-v0", dict(push_interval_s=0.04, friction_range=(0.5, 1.25), added_mass_range=(-1.0, 1.0),
                        resampling_time_s=0.04)),
    ("Go2Rough-v0", ROUGH),
])
def test_a_step_waits_for_the_gpu_only_to_find_the_envs_that_start_again(env_id, kwargs):
    """Bugs: a reset that writes Python numbers into indexed rows (`x[envs_idx] = 0.0`, a host-to-device copy each),
    a constant made with torch.tensor on every reset, `if ended.any():` before `ended.nonzero()` (two waits for one
    answer), a task's `.item()` per step. What is left: one `nonzero` per physics step (the envs Genesis flagged as
    failed) and one per agent step (the envs whose episode ended)."""
    num_envs, steps = 8, 12
    vec = envs.make(env_id, num_envs=num_envs, seed=0, sim_device="cpu", max_episode_steps=4, **kwargs)
    vec.reset()
    g = torch.Generator().manual_seed(0)
    actions = [torch.rand(num_envs, vec.single_action_space.shape[0], generator=g) * 2 - 1 for _ in range(steps)]
    vec.step(actions[0])
    ended = 0
    with EnvsSyncs(host_tensors=[getattr(vec, "steps_taken", torch.empty(0))]) as syncs:
        for action in actions[1:]:
            _, _, terminated, truncated, _ = vec.step(action)
            ended += int((terminated | truncated).sum())
    vec.close()
    assert ended >= num_envs  # every env's reset ran inside the watched steps
    others = {key: count for key, count in syncs.counts.items() if key[0] != INDICES}
    assert not others, f"syncs per {steps - 1} steps by line: {others}"
    assert sum(syncs.counts.values()) == (steps - 1) * (vec.decimation + 1)


class GenesisWrites(TorchDispatchMode):
    """Counts Genesis's own writes by index with a value made from Python (`x[idx] = 0.0`: a host copy each)."""

    def __init__(self):
        super().__init__()
        self.lifted, self.kept, self.indexed_writes = set(), [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) in FROM_PYTHON:
            self.lifted.add(id(out))
            self.kept.append(out)  # alive, so that no later tensor takes its id
        elif str(func) == "aten.index_put_.default" and id(args[2]) in self.lifted:
            self.indexed_writes += 1
        return out


def test_go2_joint_targets_reach_genesis_as_slice_writes():
    """Bug: the targets sent with a list of dofs (Genesis then writes its control mode and velocity target by index,
    each a host-to-device copy of a constant: two waits per step on a GPU) instead of the joints' block as a range."""
    vec = envs.make("Go2Walk-v0", num_envs=4, seed=0, sim_device="cpu", stagger_episodes=False)
    vec.reset()
    with GenesisWrites() as writes:  # no episode ends on this step: no reset's writes
        vec.step(torch.zeros(4, 12))
    vec.close()
    assert writes.indexed_writes == 0
