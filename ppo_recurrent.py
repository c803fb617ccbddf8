"""Recurrent PPO (GRU or LSTM) for continuous actions with truncated BPTT, in one file (CleanRL style).

    python ppo_recurrent.py                                   # FrankaReachNoVel-v0 (Genesis, no velocities)
    python ppo_recurrent.py --env-id PendulumNoVel-v1 --rnn-type lstm
    python ppo_recurrent.py --eval-checkpoint runs/<run>/checkpoint.pt --eval-episodes 1000

Each env's rollout is cut into sequences of --bptt-len steps. A sequence starts from the hidden state
stored at its first step, and the state is zeroed wherever an episode starts inside it: the sequence is
split there into segments that run through the fused GRU/LSTM kernel in one call (packed, no padding
enters any loss). Documented in docs/scripts.md, section "ppo_recurrent.py"; conventions as ppo_continuous.py.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, fields
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

import envs
from envs.video import EpisodeRecorder

# On a GPU, cuDNN's GRU and LSTM compute float32 as TF32 unless this is off (PyTorch leaves it on; its matmuls do
# full float32): a policy trained or evaluated there would not be the network that a CPU, the exported ONNX file
# or a robot runs (benchmarks/results/gpu.md: the same checkpoint's evaluation differed between the devices).
torch.backends.cudnn.allow_tf32 = False


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment, part of the run directory"""
    seed: int = 1
    """seed of the experiment (torch and the environments)"""
    torch_deterministic: bool = True
    """sets `torch.backends.cudnn.deterministic`"""
    cuda: bool = False
    """CleanRL's flag: shorthand for --policy-device cuda --sim-device cuda"""
    policy_device: Literal["auto", "cpu", "cuda"] = "auto"
    """where the networks, normalisers and rollout buffers live (auto: cuda if available)"""
    sim_device: Literal["auto", "cpu", "cuda"] = "auto"
    """where a GPU-capable simulator (Genesis) steps (auto: cuda if available); Gymnasium tasks step on the CPU"""
    track: bool = False
    """log to Weights & Biases as well as TensorBoard (WANDB_MODE=offline works without a network)"""
    wandb_project_name: str = "ppo-recurrent"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team or user)"""
    wandb_group: str | None = None
    """the W&B group (benchmarks/run.py groups the runs of one comparison)"""
    capture_video: bool = False
    """record an episode of env 0 every --video-interval iterations to the run's videos/ folder"""
    video_interval: int = 100
    """iterations between recorded training episodes"""
    progress_bar: bool = True
    """show a tqdm progress bar with SPS and the recent return"""

    env_id: str = "FrankaReachNoVel-v0"
    """the task: FrankaReachNoVel-v0, FrankaReach-v0, any Gymnasium id with Box spaces, or an envs.partial variant"""
    num_envs: int = 1024
    """parallel environments (per process under torchrun)"""
    vectorization_mode: Literal["sync", "async"] = "sync"
    """Gymnasium tasks: step envs in this process or one subprocess each"""
    total_timesteps: int = 6_000_000
    """environment steps to train for (of all processes together under torchrun)"""

    learning_rate: float = 1e-3
    """the learning rate (the initial one under a schedule)"""
    lr_schedule: Literal["constant", "linear", "cosine", "adaptive_kl"] = "adaptive_kl"
    """linear: to 0 (CleanRL); cosine: to --lr-min-fraction of it; adaptive_kl: rsl_rl's rule towards --desired-kl"""
    anneal_lr: bool = True
    """CleanRL's switch: --no-anneal-lr keeps the learning rate constant whatever --lr-schedule says"""
    lr_min_fraction: float = 0.1
    """where --lr-schedule cosine ends, as a fraction of --learning-rate"""
    desired_kl: float = 0.01
    """--lr-schedule adaptive_kl: per minibatch, the rate /1.5 above twice this KL, x1.5 below half of it"""
    critic_learning_rate: float = 0.0
    """a learning rate of its own for the critic (0: --learning-rate); schedules scale both alike"""
    optimizer: Literal["adam", "adamw"] = "adam"
    """how --weight-decay applies: adam adds it to the gradient (L2, torch's Adam); adamw decays apart (AdamW)"""
    weight_decay: float = 0.0
    """weight decay on weight matrices only (not on biases or the log-std); --optimizer says how it applies"""
    num_steps: int = 24
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalised advantage estimation"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 5
    """epochs over each rollout"""
    norm_adv: bool = True
    """normalise advantages to zero mean and unit std"""
    norm_adv_per_minibatch: bool = True
    """with --norm-adv: per minibatch (CleanRL); off: over the whole batch, once per iteration (rsl_rl)"""
    robust_adv_norm: bool = False
    """with --norm-adv: only centre advantages whose std is below 1e-4 (no blow-up when flat)"""
    clip_coef: float = 0.2
    """PPO's surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's values, as in the PPO paper's code"""
    value_loss: Literal["mse", "huber"] = "mse"
    """squared error (times 0.5), or Huber with --huber-delta (both combine with --clip-vloss)"""
    huber_delta: float = 1.0
    """where --value-loss huber turns from quadratic to linear"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 1.0
    """value loss coefficient"""
    max_grad_norm: float = 1.0
    """gradient-norm clip, over all parameters together (CleanRL) or per network (--clip-grad-per-network)"""
    clip_grad_per_network: bool = False
    """clip the actor's and the critic's gradient norms each to --max-grad-norm (rsl_rl), not their joint norm"""
    target_kl: float = 0.0
    """stop the epochs of an iteration once approx_kl exceeds this (0: never)"""
    target_kl_per_minibatch: bool = False
    """check --target-kl after every minibatch, not only at each epoch's end (ManiSkill3's ppo_fast)"""

    rnn_type: Literal["gru", "lstm"] = "gru"
    """the recurrent cell of the trunk"""
    rnn_hidden_size: int = 64
    """hidden state width of each recurrent layer"""
    rnn_layers: int = 1
    """stacked recurrent layers in a trunk"""
    shared_trunk: bool = False
    """one recurrent trunk feeding both heads (else separate actor and critic trunks, as rsl_rl)"""
    heads_see_obs: bool = True
    """the actor and critic heads get the current observation beside the trunk's output (a skip connection)"""
    bptt_len: int = 0
    """steps per training sequence (truncated BPTT); 0 means the whole rollout, as CleanRL"""
    recompute_hidden: bool = False
    """before each epoch after the first, recompute the sequences' starting states with the current weights"""
    hidden_sizes: tuple[int, ...] = (128, 64)
    """hidden layer widths of the actor and critic MLP heads on top of the trunk"""
    scan_encoder_sizes: tuple[int, ...] = (128, 64)
    """a task with a height scan (Go2Rough-v0): layer widths of the MLP that encodes it in front of the trunk"""
    privileged_critic: bool = False
    """train the critic, an MLP, on the task's critic observation (privileged state: docs/tasks.md) if it has one"""
    activation: Literal["tanh", "elu", "relu"] = "elu"
    """hidden activation"""
    init_log_std: float = 0.0
    """initial log standard deviation of the Gaussian policy"""
    action_transform: Literal["clip", "tanh"] = "clip"
    """clip: the env gets the Gaussian sample clipped to its bounds; tanh: squashed into them (with the log-det term)"""
    norm_obs: bool = True
    """normalise observations with running statistics from rollout data"""
    norm_obs_until: int = 0
    """freeze those statistics once they hold this many observations (rsl_rl's `until`; 0: never)"""
    norm_obs_eps: float = 0.0
    """added to each feature's std before dividing by it (rsl_rl's 1e-2): a floor for features that barely moved"""
    norm_reward: bool = True
    """scale rewards by the running standard deviation of the discounted return"""
    compile: bool = False
    """torch.compile the policy and the loss: the same run as without (random draws as eager), faster once compiled"""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile's mode for --compile: reduce-overhead adds CUDA graphs (fewer kernel launches; GPU only)"""

    checkpoint_interval: int = 50
    """iterations between checkpoints (one is always written at the end, on Ctrl-C and on SIGTERM)"""
    resume: str | None = None
    """checkpoint file or run directory to continue (same run directory, step counter and curves; its flags but for
    the length, devices, threads and progress bar)"""
    init_from: str | None = None
    """checkpoint file or run directory whose network and observation normalisers a new run starts from (its own
    flags, optimizer, step counter and run directory; the network's flags as the checkpoint's run had them)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint instead of training"""
    eval_interval: int = 20
    """iterations between evaluations while training, and one at the end: eval/* logs, checkpoint_best.pt (0: none)"""
    eval_episodes: int = 10
    """episodes per evaluation, spread over the envs (each env's first ones count: short ones are not favoured)"""
    export_checkpoint: str | None = None
    """write policy.onnx and policy.pt (TorchScript) beside this checkpoint: raw observation in, the env's action out"""
    env_kwargs: dict[str, int | float | bool | str] | None = None
    """extra keyword arguments for envs.make, e.g. --env-kwargs decimation 4 cube_mass_range 0.05,0.1"""
    torch_threads: int = 1
    """torch's CPU threads while the envs step (0: torch's default); one leaves the cores to the simulator"""
    update_threads: int = 0
    """torch's CPU threads during the update (0: torch's default, every core: the simulator is idle then)"""
    dist_timeout_s: int = 600
    """under torchrun: seconds a process waits for the others before the run stops (a process died or hangs)"""

    # computed from the flags at run time (not flags themselves)
    world_size: tyro.conf.Suppress[int] = 1
    """processes training together (torchrun's WORLD_SIZE)"""
    batch_size: tyro.conf.Suppress[int] = 0
    """one process's batch: num_envs * num_steps"""
    num_sequences: tyro.conf.Suppress[int] = 0
    """num_envs * num_steps // bptt_len"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """total_timesteps // (batch_size * world_size)"""
    init_from_steps: tyro.conf.Suppress[int] = 0
    """with --init-from: the steps that trained its network, its own warm starts' included (a curriculum's earlier
    stages: benchmarks/eval_compare.py --steps-in-all)"""


# Args' defaults are the Genesis arm's trained as whole-rollout sequences (rsl_rl's recurrent setup, a smaller GRU);
# any other task starts from CleanRL's settings with 64-step sequences, and a task's entry overrides them.
# Why each is what it is, with the measurements: benchmarks/results/presets.md.
CLEANRL = dict(
    num_envs=1, total_timesteps=1_000_000, learning_rate=3e-4, lr_schedule="linear", num_steps=2048, bptt_len=64,
    num_minibatches=32, update_epochs=10, vf_coef=0.5, max_grad_norm=0.5, hidden_sizes=(64,), activation="tanh",
    torch_threads=0,
    eval_interval=0,  # CleanRL evaluates once trained (--eval-checkpoint); the robot tasks evaluate while training
)
PENDULUM = dict(
    CLEANRL, num_envs=4, total_timesteps=300_000, learning_rate=1e-3, num_steps=1024, gamma=0.9, bptt_len=32,
    num_minibatches=16, init_log_std=-0.5,
)
PRESETS = {"FrankaReach-v0": {}, "FrankaReachNoVel-v0": {}, "FrankaReachDelay-v0": {}, "Pendulum-v1": PENDULUM,
           "PendulumNoVel-v1": PENDULUM}
# Whole-episode sequences, so that the reward the cue (seen in the first 5 of 100 steps) earns reaches it.
PRESETS["FrankaReachCue-v0"] = dict(num_envs=256, num_steps=100)  # bptt_len 0: the whole rollout
# The cube tasks: ManiSkill3's PPO settings for PushCube-v1 and PickCube-v1 (gamma 0.8, lambda 0.9) on the arm's, but
# pushing looks further ahead (gamma 0.95, about 1 s): on the randomised push this GRU solved 95-97% of episodes at
# 2M steps against 52-85% with 0.8 (the MLP's reason: with 0.8 it let the cube slide out on slippery tables).
PRESETS["FrankaPushCube-v0"] = PRESETS["FrankaPushCubeRandom-v0"] = dict(
    gamma=0.95, gae_lambda=0.9, total_timesteps=10_000_000)
# Picking keeps ManiSkill3's gamma 0.8 (with 0.95 seed 3 left the plateau of holding the cube only 0.25M steps sooner)
# and takes its network (heads 3x256, std 0.6) and updates (8 epochs x 32 minibatches at a constant 3e-4, epochs stopped
# past KL 0.1), as ppo_continuous.py's: on the arm's its MLP lifted the cube, never to the goal.
PRESETS["FrankaPickCube-v0"] = dict(
    PRESETS["FrankaPushCube-v0"], gamma=0.8, hidden_sizes=(256, 256, 256), init_log_std=-0.5, num_minibatches=32,
    update_epochs=8, learning_rate=3e-4, lr_schedule="constant", target_kl=0.1, total_timesteps=5_000_000)
# Stacking, and with unobserved masses and frictions: the picking settings for ManiSkill3's StackCube-v1 budget (25M
# steps), raw observations: with ppo_continuous.py's normaliser A was slid along the table for 25M steps (with a floor
# on each std, which keeps A's lift off the clip, on B in 98% at 16M, let go in 3%); without it A was on B in 96% of
# evaluations at 3.7M. The KL checked after every minibatch: at each epoch's end one epoch reached KL 0.795 and that
# MLP fell apart.
PRESETS["FrankaStackCube-v0"] = PRESETS["FrankaStackCubeRandom-v0"] = dict(
    PRESETS["FrankaPickCube-v0"], norm_obs=False, target_kl_per_minibatch=True, total_timesteps=25_000_000)
# Genesis's locomotion example (rsl_rl's settings, as the arm's) with its entropy bonus and ~10M-step budget.
PRESETS["Go2Walk-v0"] = PRESETS["Go2WalkNoVel-v0"] = PRESETS["Go2WalkNoVelAll-v0"] = dict(
    ent_coef=0.01, total_timesteps=10_000_000)
# Rough terrain: the walking settings for twice the steps; the height scan through --scan-encoder-sizes' MLP.
PRESETS["Go2Rough-v0"] = PRESETS["Go2RoughBlind-v0"] = dict(PRESETS["Go2Walk-v0"], total_timesteps=20_000_000)


def task_args(env_id: str, **flags) -> Args:
    """The settings a run on `env_id` starts from (its preset, else CleanRL's), with `flags` on top."""
    return Args(**{**PRESETS.get(env_id, CLEANRL), "env_id": env_id, **flags})


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
ACTIVATIONS = {"tanh": nn.Tanh, "elu": nn.ELU, "relu": nn.ReLU}


def mlp(in_dim: int, hidden_sizes, out_dim: int, activation: str, out_std: float) -> nn.Sequential:
    layers, width = [], in_dim
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(width, size)), ACTIVATIONS[activation]()]
        width = size
    return nn.Sequential(*layers, layer_init(nn.Linear(width, out_dim), std=out_std))


def sequence_segments(starts: torch.Tensor):
    """Splits B sequences of K steps wherever an episode starts inside them (starts[t, b], t > 0).

    Returns, for the flattened b-major steps (index b * K + t): the segment of each step and its offset in the
    segment; and per segment: its length, its sequence and whether it begins at the sequence's first step.
    """
    K, B = starts.shape
    begins = starts.clone()
    begins[0] = True
    begins = begins.T.reshape(-1)
    segment = begins.long().cumsum(0) - 1
    begin_index = begins.nonzero().squeeze(1)
    offset = torch.arange(K * B, device=starts.device) - begin_index[segment]
    lengths = torch.diff(begin_index, append=torch.tensor([K * B], device=starts.device))
    return segment, offset, lengths, begin_index // K, begin_index % K == 0


class RecurrentAgent(nn.Module):
    """GRU/LSTM trunk(s) feeding MLP actor and critic heads; a Gaussian policy with a state-independent log-std.

    The recurrent state of a batch of envs is one (B, state_size) tensor: every trunk's hidden (and, for an
    LSTM, cell) state of every layer, flattened, so that buffers and checkpoints hold it as a plain tensor.
    Actions are scored and transformed as in ppo_continuous.py (stored unclipped; clip or tanh for the env).
    """

    def __init__(self, args: Args, obs_space, action_space, critic_obs_space=None, scan_size: int = 0):
        super().__init__()
        if args.action_transform == "tanh" and not (np.isfinite(action_space.low).all()
                                                    and np.isfinite(action_space.high).all()):
            raise UsageError(f"--action-transform tanh needs finite action bounds; {args.env_id} has {action_space}")
        obs_dim, act_dim = obs_space.shape[0], action_space.shape[0]
        # A height scan (the observation's last `scan_size` entries) is encoded by an MLP of its own and joins the
        # rest of the observation in front of the trunk: 187 heights would otherwise swamp a 48-number state.
        self.scan_size = scan_size if args.scan_encoder_sizes else 0
        if self.scan_size:
            sizes, activation = args.scan_encoder_sizes, args.activation
            self.scan_encoder = nn.Sequential(mlp(scan_size, sizes[:-1], sizes[-1], activation, out_std=math.sqrt(2)),
                                              ACTIVATIONS[activation]())
            obs_dim = obs_dim - scan_size + sizes[-1]  # what the trunk and the heads' skip connection read
        rnn_hidden_size, rnn_layers = args.rnn_hidden_size, args.rnn_layers
        rnn_class = nn.GRU if args.rnn_type == "gru" else nn.LSTM
        # Given a critic observation of its own (--privileged-critic), the critic is an MLP on it, as rsl_rl allows
        # beside a recurrent actor: what it needs to remember is in that observation, so one trunk, the actor's.
        self.privileged = critic_obs_space is not None
        num_trunks = 1 if args.shared_trunk or self.privileged else 2
        self.trunks = nn.ModuleList(rnn_class(obs_dim, rnn_hidden_size, rnn_layers) for _ in range(num_trunks))
        for name, param in self.trunks.named_parameters():
            if "weight" in name:
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.constant_(param, 0.0)
        self.state_parts = 2 if args.rnn_type == "lstm" else 1
        self.layers, self.hidden = rnn_layers, rnn_hidden_size
        self.actor_state_size = self.state_parts * rnn_layers * rnn_hidden_size  # the actor's trunk alone
        self.state_size = len(self.trunks) * self.actor_state_size
        self.heads_see_obs = args.heads_see_obs
        head_input = rnn_hidden_size + (obs_dim if args.heads_see_obs else 0)
        critic_input = critic_obs_space.shape[0] if self.privileged else head_input
        self.critic = mlp(critic_input, args.hidden_sizes, 1, args.activation, out_std=1.0)
        self.actor_mean = mlp(head_input, args.hidden_sizes, act_dim, args.activation, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), float(args.init_log_std)))
        self.transform = args.action_transform
        self.register_buffer("action_low", torch.as_tensor(action_space.low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_space.high, dtype=torch.float32))

    @torch.no_grad()
    def sequence_start_states(self, obs, state, starts, K: int) -> torch.Tensor:
        """The state entering each K-step chunk of a (T, N) rollout that started from `state`, rerun with the current
        weights (T/K fused calls), so that the update's sequences start where this policy would be."""
        chunk_states = []
        for chunk in range(obs.shape[0] // K):
            chunk_states.append(state)
            steps = slice(chunk * K, (chunk + 1) * K)
            _, _, state = self.features(obs[steps], state, starts[steps])
        return torch.stack(chunk_states).flatten(0, 1)

    def is_critic(self, name: str) -> bool:
        """Whether a parameter serves the value alone (its head, and its own trunk if it has one)."""
        return name.startswith("critic") or (len(self.trunks) == 2 and name.startswith("trunks.1."))

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """The trunk's input: the observation, its height scan (if any) replaced by the scan encoder's output."""
        if not self.scan_size:
            return obs
        return torch.cat([obs[..., :-self.scan_size], self.scan_encoder(obs[..., -self.scan_size:])], -1)

    def initial_state(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, self.state_size, device=self.action_low.device)

    def _unpack(self, state: torch.Tensor, trunk: int):
        """(B, state_size) -> the trunk's nn.GRU h0 (layers, B, hidden) or nn.LSTM (h0, c0)."""
        parts = state.view(-1, len(self.trunks), self.state_parts, self.layers, self.hidden)[:, trunk]
        parts = parts.permute(1, 2, 0, 3).contiguous()
        return parts[0] if self.state_parts == 1 else (parts[0], parts[1])

    def _pack(self, trunk_states) -> torch.Tensor:
        parts = [torch.stack(s) if isinstance(s, tuple) else s[None] for s in trunk_states]
        return torch.stack(parts).permute(3, 0, 1, 2, 4).reshape(parts[0].shape[2], self.state_size)

    def features(self, obs, state, starts, critic_only: bool = False, final_state: bool = True):
        """Runs the trunk(s) over (K, B, obs_dim) observations from `state` (B, state_size), the state entering
        step 0, zeroed wherever an episode starts (starts[t, b]). Returns the actor and critic features
        (K, B, hidden [+ obs_dim]) and the state after step K-1 (if `final_state`).

        Without episode starts inside the sequences this is one GRU/LSTM call over (K, B). Otherwise each
        sequence is split at its episode starts and all segments go through one call side by side, each from
        its own initial state (zeros at an episode start), end-padded to the longest: an output never depends
        on a later step, so the padding reaches no output that is read. The state after the last step needs
        the segments packed instead (about twice as slow on CPU), so that is only done when asked for.
        """
        K, B = starts.shape
        state = state * ~starts[0, :, None]
        obs = self.encode(obs)
        indices = [len(self.trunks) - 1] if critic_only else range(len(self.trunks))
        outputs, final_states = [], []
        if K == 1 or not starts[1:].any():  # K == 1 (acting) never syncs with the device
            for i in indices:
                out, final = self.trunks[i](obs, self._unpack(state, i))
                outputs.append(out)
                final_states.append(final)
        else:
            segment, offset, lengths, sequence, at_first_step = sequence_segments(starts)
            flat_obs = obs.transpose(0, 1).reshape(K * B, -1)
            segments = flat_obs.new_zeros(int(lengths.max()), len(lengths), flat_obs.shape[-1])
            segments[offset, segment] = flat_obs
            if final_state:
                segments = nn.utils.rnn.pack_padded_sequence(segments, lengths.cpu(), enforce_sorted=False)
            last_segment = segment.view(B, K)[:, -1]
            for i in indices:
                out, final = self.trunks[i](segments, self._unpack(state[sequence] * at_first_step[:, None], i))
                if final_state:
                    out, _ = nn.utils.rnn.pad_packed_sequence(out)
                    final_states.append(tuple(f[:, last_segment] for f in final) if isinstance(final, tuple)
                                        else final[:, last_segment])
                outputs.append(out[offset, segment].view(B, K, -1).transpose(0, 1))
        if self.heads_see_obs:
            outputs = [torch.cat([out, obs], -1) for out in outputs]
        next_state = self._pack(final_states) if final_state and not critic_only else None
        return (None if critic_only else outputs[0]), outputs[-1], next_state

    def log_prob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log-density of the raw sample under N(mean, exp(log_std)), with the tanh correction if squashed. Closed
        forms instead of torch.distributions: the same numbers (tested), at half the cost of an acting step."""
        log_std = self.actor_logstd
        log_prob = (-0.5 * ((action - mean) * torch.exp(-log_std)).square() - log_std - HALF_LOG_2PI).sum(-1)
        if self.transform == "tanh":
            # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)): finite for any u, unlike log(1 - tanh^2)
            log_det = 2.0 * (math.log(2.0) - action - nn.functional.softplus(-2.0 * action))
            log_prob = log_prob - (log_det + torch.log((self.action_high - self.action_low) / 2)).sum(-1)
        return log_prob

    def get_action_and_value(self, obs, state, starts, action=None, critic_obs=None):
        """(action, log-prob, entropy, value, next state). Acting (`action` None): one step of (B, obs_dim)
        observations after `state`, a new sample and the state after it. The update: (K, B) sequences of stored
        steps from their starting states, the given actions scored (no next state). A privileged critic values
        `critic_obs`, shaped as `obs`."""
        acting = action is None
        if acting:
            obs, starts = obs[None], starts[None]
            critic_obs = None if critic_obs is None else critic_obs[None]
        actor_features, critic_features, next_state = self.features(obs, state, starts, final_state=acting)
        mean = self.actor_mean(actor_features)
        if acting:
            action = mean + self.actor_logstd.exp() * torch.randn_like(mean)
        entropy = (self.actor_logstd + 0.5 + HALF_LOG_2PI).sum(-1).expand(mean.shape[:-1])
        value = self.critic(critic_obs if self.privileged else critic_features).squeeze(-1)
        outputs = action, self.log_prob(mean, action), entropy, value
        return (*(x[0] for x in outputs), next_state) if acting else (*outputs, None)

    def get_value(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor,
                  critic_obs: torch.Tensor | None = None) -> torch.Tensor:
        """V of (B, obs_dim) observations after `state` (or of `critic_obs` for a privileged critic); the state
        itself is left to the caller, unchanged."""
        if self.privileged:
            return self.critic(critic_obs).squeeze(-1)
        _, critic_features, _ = self.features(obs[None], state, starts[None], critic_only=True, final_state=False)
        return self.critic(critic_features[0]).squeeze(-1)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        if self.transform == "tanh":
            return self.action_low + (torch.tanh(action) + 1) * (self.action_high - self.action_low) / 2
        return action.clamp(self.action_low, self.action_high)

    def actor_step(self, obs: torch.Tensor, actor_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the policy alone, as deployed: (B, obs_dim) observations and the actor trunk's state
        (B, actor_state_size, laid out as its slice of the full state) -> the env's mean action and that trunk's next
        state. A separate critic trunk, which acting does not need, does not run."""
        x = self.encode(obs)[None]
        parts = actor_state.view(-1, self.state_parts, self.layers, self.hidden).permute(1, 2, 0, 3).contiguous()
        out, final = self.trunks[0](x, parts[0] if self.state_parts == 1 else (parts[0], parts[1]))
        features = torch.cat([out[0], x[0]], -1) if self.heads_see_obs else out[0]
        final = torch.stack(final) if isinstance(final, tuple) else final[None]  # (parts, layers, B, hidden)
        return self.env_action(self.actor_mean(features)), final.permute(2, 0, 1, 3).reshape(x.shape[1], -1)


def build_agent(args: Args, vec, device: torch.device, critic_shape: tuple | None = None
                ) -> tuple[RecurrentAgent, ObsNormalizer, ObsNormalizer | None]:
    """The agent, its observation normaliser and, with --privileged-critic on a task that has a critic observation,
    the critic observation's own normaliser (else None: the critic reads the policy's features). `critic_shape`,
    where given, is the critic observation's shape to build for instead of the task's."""
    critic_space = vec.single_critic_observation_space if args.privileged_critic else None
    if critic_shape is not None:  # a checkpoint's critic, built whatever the task offers now (`deployed_policy`)
        critic_space = gym.spaces.Box(-np.inf, np.inf, critic_shape, np.float32)
    agent = RecurrentAgent(args, vec.single_observation_space, vec.single_action_space, critic_space,
                           getattr(vec, "scan_size", 0)).to(device)
    obs_norm = ObsNormalizer(vec.single_observation_space.shape, args.norm_obs, args.norm_obs_until,
                             args.norm_obs_eps).to(device)
    if critic_space is None:
        return agent, obs_norm, None
    return agent, obs_norm, ObsNormalizer(critic_space.shape, args.norm_obs, args.norm_obs_until,
                                           args.norm_obs_eps).to(device)


def to_sequences(x: torch.Tensor, K: int) -> torch.Tensor:
    """(T, N, ...) rollout tensors -> (K, T/K * N, ...) sequences: sequence c * N + n holds env n's steps
    cK .. cK + K - 1."""
    T, N = x.shape[:2]
    return x.view(T // K, K, N, *x.shape[2:]).transpose(0, 1).reshape(K, T // K * N, *x.shape[2:])


def compute_gae(rewards, values, last_value, final_values, terminated, truncated, gamma, gae_lambda):
    """Generalised advantage estimation over a (num_steps, num_envs) rollout.

    The value of the state after step t is: 0 if the episode terminated there; V(final_obs) of the ended
    episode if it was truncated; otherwise V of the next stored observation (`last_value` after the last step).
    Advantages never flow across an episode boundary. Returns (advantages, returns = advantages + values).
    """
    next_values = torch.cat([values[1:], last_value[None]])
    next_values = torch.where(truncated, final_values, next_values)
    next_values = torch.where(terminated, torch.zeros_like(next_values), next_values)
    not_done = (~(terminated | truncated)).to(rewards.dtype)
    deltas = rewards + gamma * next_values - values
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(rewards.shape[0])):
        running = deltas[t] + gamma * gae_lambda * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


def normalise_advantages(advantages: torch.Tensor, args: Args) -> torch.Tensor:
    """Advantages to zero mean and unit std (under torchrun, with the statistics of every process's data together)."""
    if dist.is_initialized():
        mean, std = mean_std_over_processes(advantages)
    else:
        mean, std = advantages.mean(), advantages.std()
    if args.robust_adv_norm:  # flat advantages (a solved task, sparse rewards): centre, do not blow them up
        std = torch.where(std < 1e-4, torch.ones_like(std), std)
    return (advantages - mean) / (std + 1e-8)


def ppo_loss(agent, obs, actions, states, starts, old_logprobs, advantages, returns, old_values, critic_obs,
             args: Args):
    """The clipped PPO objective on a minibatch of (K, B) sequences that start from `states` (B, state_size);
    returns (loss, stats). Advantages are normalised here when per minibatch; returns are the value targets as they
    are. Every step of every sequence is real data: nothing is padded, so nothing needs masking. `critic_obs`: a
    privileged critic's observations, or None."""
    _, new_logprobs, entropy, new_values, _ = agent.get_action_and_value(obs, states, starts, actions, critic_obs)
    logratio = new_logprobs - old_logprobs
    ratio = logratio.exp()
    if args.norm_adv and args.norm_adv_per_minibatch:
        advantages = normalise_advantages(advantages, args)
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    def value_error(values):  # per step; clipping keeps the larger error of the new and the clipped value
        if args.value_loss == "huber":
            return nn.functional.huber_loss(values, returns, reduction="none", delta=args.huber_delta)
        return 0.5 * (values - returns).square()

    v_loss = value_error(new_values)
    if args.clip_vloss:
        clipped = old_values + (new_values - old_values).clamp(-args.clip_coef, args.clip_coef)
        v_loss = torch.max(v_loss, value_error(clipped))
    v_loss = v_loss.mean()
    entropy = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    with torch.no_grad():
        stats = {
            "policy_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "old_approx_kl": (-logratio).mean(),
            "approx_kl": ((ratio - 1) - logratio).mean(),
            "clipfrac": ((ratio - 1).abs() > args.clip_coef).float().mean(),
            "ratio_max_dev": (ratio - 1).abs().max(),
        }
    return loss, stats


def is_weight_matrix(name: str, param: nn.Parameter) -> bool:
    """What weight decay applies to: layers' weight matrices, not biases, norms, the log-std or positions."""
    return "weight" in name.rsplit(".", 1)[-1] and param.dim() >= 2


def make_optimizer(agent: nn.Module, args: Args) -> torch.optim.Optimizer:
    """Adam or AdamW over the actor's and the critic's parameters, each group with its initial rate in
    "initial_lr" (the schedules scale it); weight decay on weight matrices only, as an L2 term in Adam's gradient or
    decoupled from it in AdamW (Loshchilov and Hutter: the L2 term is scaled down where gradients are large)."""
    groups = []
    for is_critic, lr in ((False, args.learning_rate), (True, args.critic_learning_rate or args.learning_rate)):
        params = [(name, p) for name, p in agent.named_parameters() if agent.is_critic(name) == is_critic]
        matrices = [p for name, p in params if is_weight_matrix(name, p)]
        others = [p for name, p in params if not is_weight_matrix(name, p)]
        for decay, selected in ((args.weight_decay, matrices), (0.0, others)):
            if selected:
                groups.append({"params": selected, "lr": lr, "initial_lr": lr, "weight_decay": decay})
    # fused: one kernel for all parameters instead of a dozen tensor ops per parameter (on the CPU the update's
    # optimizer steps took a third of the time of a 64x64 MLP's minibatch; the same numbers to float rounding)
    fused = all(p.device.type in ("cpu", "cuda") for p in agent.parameters())
    return (torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam)(groups, eps=1e-5, fused=fused)


def lr_fraction(args: Args, iteration: int) -> float:
    """The scheduled fraction of the initial learning rates at `iteration` (1-based; adaptive_kl moves on its own)."""
    progress = (iteration - 1.0) / args.num_iterations
    if not args.anneal_lr or args.lr_schedule in ("constant", "adaptive_kl"):
        return 1.0
    if args.lr_schedule == "linear":
        return 1.0 - progress
    return args.lr_min_fraction + (1.0 - args.lr_min_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))


def adapt_lr(optimizer: torch.optim.Optimizer, approx_kl: float, desired_kl: float) -> None:
    """rsl_rl's adaptive rate: /1.5 when the KL is above twice the desired one, x1.5 below half of it, within
    [1e-5, 1e-2] for the actor; the critic's rate keeps its ratio to the actor's."""
    groups = optimizer.param_groups
    scale = 1 / 1.5 if approx_kl > 2.0 * desired_kl else (1.5 if approx_kl < 0.5 * desired_kl else 1.0)
    fraction = min(1e-2, max(1e-5, groups[0]["lr"] * scale)) / groups[0]["initial_lr"]
    for group in groups:
        group["lr"] = fraction * group["initial_lr"]


def grad_norms(agent: nn.Module) -> dict[str, torch.Tensor]:
    """Per-parameter gradient L2 and max-abs norms (before clipping), on the first minibatch of an update."""
    norms = {}
    for name, param in agent.named_parameters():
        if param.grad is not None:
            norms[f"grad_l2/{name}"] = param.grad.norm()
            norms[f"grad_max/{name}"] = param.grad.abs().max()
    return norms


def kl_stop(approx_kl: torch.Tensor, end_of_epoch: bool, args: Args) -> bool:
    """--target-kl's early stop, after a minibatch's step, on that minibatch's KL (measured before the step): at an
    epoch's end (CleanRL), or after any minibatch with --target-kl-per-minibatch (ManiSkill3's ppo_fast), which keeps
    one epoch of many minibatches from carrying the policy far past the target. Reads the KL only where it may stop."""
    if not args.target_kl or not (end_of_epoch or args.target_kl_per_minibatch):
        return False
    return approx_kl.item() > args.target_kl


def update(agent: RecurrentAgent, optimizer: torch.optim.Optimizer, loss_fn, batch: tuple, state_buf: torch.Tensor,
           args: Args) -> tuple[dict, float]:
    """PPO's epochs on one rollout cut into sequences of --bptt-len steps, a minibatch being a set of sequences:
    `batch` = (obs, starts, actions, logprobs, values, advantages, returns, critic_obs or None), each (num_steps,
    num_envs, ...), and
    `state_buf` the state entering each step. Returns the losses' means and the first minibatch's diagnostics (as
    logged), and the epochs done (a fraction when a minibatch stopped them)."""
    K = args.bptt_len
    if args.norm_adv and not args.norm_adv_per_minibatch:
        batch = (*batch[:5], normalise_advantages(batch[5], args), *batch[6:])
    # obs, starts, actions, logprobs, values, advantages, returns, critic_obs
    sequences = [x if x is None else to_sequences(x, K) for x in batch]
    s_states = state_buf[::K].reshape(args.num_sequences, agent.state_size)
    sequences_per_minibatch = args.num_sequences // args.num_minibatches
    stat_sums: dict[str, torch.Tensor] = {}
    num_updates = 0
    # rsl_rl clips each network's gradient on its own: a large value error then cannot shrink the policy's step
    networks = [[p for name, p in agent.named_parameters() if agent.is_critic(name) == is_critic]
                for is_critic in (False, True)] if args.clip_grad_per_network else [list(agent.parameters())]
    for epoch in range(args.update_epochs):
        if args.recompute_hidden and epoch > 0:  # the stored states came from the rollout's weights
            s_states = agent.sequence_start_states(batch[0], state_buf[0], batch[1], K)
        permutation = torch.randperm(args.num_sequences, device=state_buf.device)
        for start in range(0, args.num_sequences, sequences_per_minibatch):
            idx = permutation[start : start + sequences_per_minibatch]
            # index_select, not x[:, idx]: the same sequences at a third to a quarter of the cost on the CPU
            obs, starts, actions, logprobs, values, advantages, returns, critic_obs = (
                x if x is None else x.index_select(1, idx) for x in sequences)
            loss, stats = loss_fn(agent, obs, actions, s_states.index_select(0, idx), starts, logprobs, advantages,
                                   returns, values, critic_obs, args)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # torchrun: every process steps with the mean gradient and, for the adaptive rate and the early stop,
            # the mean KL, so they stay identical
            average_over_processes([p.grad for p in agent.parameters() if p.grad is not None] + [stats["approx_kl"]])
            if num_updates == 0:  # once per iteration: the policy that acted, and its gradients (a copy: with CUDA
                # graphs the next minibatch's loss writes its outputs into the same memory)
                first_minibatch = {"debug/first_minibatch_ratio_max_dev": stats["ratio_max_dev"].clone(),
                                   **{f"gradients/{k}": v for k, v in grad_norms(agent).items()}}
            norms = [nn.utils.clip_grad_norm_(params, args.max_grad_norm) for params in networks]
            stats["grad_norm_total"] = torch.linalg.vector_norm(torch.stack(norms))  # of all, before clipping
            optimizer.step()
            if args.anneal_lr and args.lr_schedule == "adaptive_kl":
                adapt_lr(optimizer, stats["approx_kl"].item(), args.desired_kl)
            for key, value in stats.items():
                stat_sums[key] = stat_sums.get(key, 0.0) + value
            num_updates += 1
            stop = kl_stop(stats["approx_kl"], start + sequences_per_minibatch >= args.num_sequences, args)
            if stop:
                break
        if stop:
            break
    losses = {f"losses/{k}": v / num_updates for k, v in stat_sums.items() if k != "ratio_max_dev"}
    return {**losses, **first_minibatch}, num_updates / args.num_minibatches


class RunningMeanStd(nn.Module):
    """Running mean and variance, merged batch by batch as (count, mean, M2) (Chan et al.), so that
    statistics from several workers can be merged the same way."""

    def __init__(self, shape=(), epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))
        # The count depends on batch sizes only: a host copy spares a tensor op or a device sync per update.
        self.host_count = epsilon
        self.register_load_state_dict_post_hook(lambda module, _: setattr(module, "host_count", module.count.item()))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        batch_var, batch_mean = torch.var_mean(x.double(), dim=0, unbiased=False)
        batch_count = x.shape[0]
        if dist.is_initialized():  # torchrun: merge every process's batch (equal sizes), so all normalise alike
            moments = [torch.empty((2, *batch_mean.shape), dtype=torch.float64, device=x.device)
                       for _ in range(dist.get_world_size())]
            dist.all_gather(moments, torch.stack([batch_mean, batch_var]))
            means, variances = torch.stack(moments).unbind(1)
            batch_mean, batch_var = means.mean(0), variances.mean(0) + means.var(0, unbiased=False)
            batch_count *= len(moments)
        count = self.host_count
        total = count + batch_count
        delta = batch_mean - self.mean
        # M2 = var * count; merged M2 = M2_a + M2_b + delta^2 * n_a * n_b / n
        self.var.mul_(count / total).add_(batch_var, alpha=batch_count / total)
        self.var.addcmul_(delta, delta, value=count * batch_count / total**2)
        self.mean.add_(delta, alpha=batch_count / total)
        self.count.fill_(total)
        self.host_count = total


class ObsNormalizer(RunningMeanStd):
    """Observations standardised by running statistics and clipped to +-10; passed through with --no-norm-obs.
    With `until` > 0 the statistics stop moving once they hold that many observations: the policy's inputs then
    stop drifting under it. `eps` is added to each std (rsl_rl's EmpiricalNormalization adds 1e-2): a feature that
    hardly varied (a cube's height while it rests) then does not reach the clip at its first small move."""

    def __init__(self, shape, enabled: bool = True, until: int = 0, eps: float = 0.0):
        super().__init__(shape)
        self.enabled, self.until, self.eps = enabled, until, eps
        # The float32 shift and scale, refreshed whenever the statistics change: normalising (twice per step) then
        # takes three tensor ops instead of six, which with few envs is a visible share of a step.
        self.register_buffer("shift", torch.zeros(shape), persistent=False)
        self.register_buffer("scale", torch.ones(shape), persistent=False)
        self.refresh()
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh())

    @torch.no_grad()
    def refresh(self) -> None:
        self.shift.copy_(self.mean)
        self.scale.copy_((self.var + 1e-8).sqrt().add_(self.eps).reciprocal())

    def update(self, x: torch.Tensor) -> None:
        if self.enabled and not 0 < self.until <= self.host_count:
            super().update(x)
            self.refresh()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return obs
        return ((obs - self.shift) * self.scale).clamp(-10.0, 10.0)

    @torch.no_grad()
    def clipped_share(self, normalised: torch.Tensor) -> torch.Tensor:
        """The largest share of one feature's entries at the clip, over these normalised observations (..., features).
        A feature that hardly varied so far (a cube resting on the table) saturates once it moves by 10 of its
        standard deviations: the networks then cannot tell how far it moved. 0 with normalisation off."""
        if not self.enabled:
            return normalised.new_zeros(())
        return (normalised.abs() >= 10.0).flatten(0, -2).float().mean(0).max()


class RewardScaler(nn.Module):
    """Divides rewards by the running std of each env's discounted return (as Gymnasium's NormalizeReward,
    but the running return restarts after the episode that ended, not before its last reward).

    Scales a whole rollout once it is collected (only the update reads rewards): the same numbers as merging
    each step's returns into the statistics in turn, in one tensor op per step instead of about fifteen (with one
    env, training/raw throughput on HalfCheetah went from 0.21-0.26 to 0.27-0.29)."""

    def __init__(self, num_envs: int, gamma: float):
        super().__init__()
        self.gamma = gamma
        self.return_rms = RunningMeanStd()
        self.register_buffer("returns", torch.zeros(num_envs, dtype=torch.float64))

    @torch.no_grad()
    def forward(self, rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        """rewards, dones: (num_steps, num_envs), in rollout order; returns the scaled rewards."""
        keep = (~dones).double()
        returns = rewards.double()  # R_t = r_t + gamma R_{t-1}, restarting after an episode's last step
        steps, keeps = returns.unbind(0), keep.unbind(0)  # views made once: indexing costs as much as the op
        steps[0].add_(self.returns, alpha=self.gamma)
        for t in range(1, len(steps)):
            steps[t].addcmul_(steps[t - 1], keeps[t - 1], value=self.gamma)
        self.returns.copy_(returns[-1] * keep[-1])
        # Statistics after each step's merge, from cumulative sums of deviations from the prior mean m0 (stable
        # in float64 while the mean moves little within a rollout): M2_t = c0 v0 + sum (x - m0)^2 - n_t (mean_t - m0)^2
        stats, batch = self.return_rms, returns.shape[1]
        deviations = returns - stats.mean
        sums = torch.stack([deviations.sum(1), deviations.square().sum(1)])
        if dist.is_initialized():  # torchrun: the statistics of every process's returns, so all scale alike
            dist.all_reduce(sums)
            batch *= dist.get_world_size()
        steps_so_far = torch.arange(1, len(returns) + 1, dtype=torch.float64, device=returns.device)
        counts = stats.host_count + batch * steps_so_far
        mean_shifts = sums[0].cumsum(0) / counts
        variances = ((sums[1].cumsum(0) + stats.host_count * stats.var) / counts - mean_shifts.square()).clamp(min=0.0)
        stats.mean.add_(mean_shifts[-1])
        stats.var.copy_(variances[-1])
        stats.host_count += batch * len(returns)
        stats.count.fill_(stats.host_count)
        return (rewards / torch.sqrt(variances + 1e-8)[:, None]).float()


@dataclass
class RolloutBuffers:
    """One rollout, each (num_steps, num_envs, ...): allocated once on the policy's device, refilled every iteration."""

    obs: torch.Tensor
    final_obs: torch.Tensor  # info["final_obs"] of each step: V(final_obs) bootstraps a truncated episode
    actions: torch.Tensor
    states: torch.Tensor  # the state entering each step (zero where an episode starts)
    final_states: torch.Tensor  # the state after each step (for V(final_obs))
    starts: torch.Tensor  # the steps that start an episode
    logprobs: torch.Tensor
    rewards: torch.Tensor
    values: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    critic_obs: torch.Tensor | None = None  # the critic's own observations and final ones (--privileged-critic)
    final_critic_obs: torch.Tensor | None = None

    @classmethod
    def allocate(cls, args: Args, vec, state_size: int, device: torch.device,
                 critic_obs_dim: int = 0) -> RolloutBuffers:
        T, N = args.num_steps, args.num_envs
        obs_dim, act_dim = vec.single_observation_space.shape[0], vec.single_action_space.shape[0]
        buf = lambda *shape, dtype=torch.float32: torch.zeros((T, N, *shape), dtype=dtype, device=device)  # noqa: E731
        critic = dict(critic_obs=buf(critic_obs_dim), final_critic_obs=buf(critic_obs_dim)) if critic_obs_dim else {}
        return cls(obs=buf(obs_dim), final_obs=buf(obs_dim), actions=buf(act_dim), states=buf(state_size),
                   final_states=buf(state_size), starts=buf(dtype=torch.bool), logprobs=buf(), rewards=buf(),
                   values=buf(), terminated=buf(dtype=torch.bool), truncated=buf(dtype=torch.bool), **critic)


@torch.inference_mode()
def collect_rollout(agent: RecurrentAgent, get_action_and_value, obs_norm: ObsNormalizer,
                    critic_norm: ObsNormalizer | None, vec, rollout: RolloutBuffers, carry: dict,
                    reports: RolloutReports, run: Run, global_step: int, iteration: int,
                    args: Args) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps the envs num_steps times with the policy (`get_action_and_value`: the agent's, compiled or not), from
    where the last rollout ended (`carry`: the last observation and each env's recurrent state, moved on to where
    this one ends), filling `rollout` and `reports`; with a critic normaliser, the critic's own observations too.
    Returns the normalised observation after the last step, and the critic's (None without one)."""
    T, N = args.num_steps, args.num_envs
    next_obs, rnn_state, next_start = obs_norm(carry["next_obs_raw"]), carry["rnn_state"], carry["next_start"]
    next_critic_obs = None if critic_norm is None else critic_norm(carry["next_critic_obs_raw"])
    for step in range(T):
        rollout.obs[step] = next_obs
        if critic_norm is not None:
            rollout.critic_obs[step] = next_critic_obs
        rnn_state = rnn_state * ~next_start[:, None]
        rollout.states[step], rollout.starts[step] = rnn_state, next_start
        action, logprob, _, value, rnn_state = get_action_and_value(next_obs, rnn_state, next_start, None,
                                                                    next_critic_obs)
        rollout.actions[step], rollout.logprobs[step], rollout.values[step] = action, logprob, value
        rollout.final_states[step] = rnn_state
        next_obs_raw, reward, terminated, truncated, info = step_envs(
            vec, agent.env_action(action), args.env_id, global_step + step * N, iteration)
        done = terminated | truncated
        next_start = done
        obs_norm.update(next_obs_raw)
        next_obs, rollout.final_obs[step] = obs_norm(next_obs_raw), obs_norm(info["final_obs"])
        if critic_norm is not None:
            carry["next_critic_obs_raw"] = info["critic_obs"]
            critic_norm.update(info["critic_obs"])
            next_critic_obs = critic_norm(info["critic_obs"])
            rollout.final_critic_obs[step] = critic_norm(info["final_critic_obs"])
        rollout.rewards[step] = reward
        rollout.terminated[step], rollout.truncated[step] = terminated, truncated
        reports.record(step, info)
        if run.recorder is not None:
            run.record_video(done, global_step, (step + 1) * N)
    # the state's own copy: with CUDA graphs (--compile-mode reduce-overhead) the update's loss would write over it
    carry.update(next_obs_raw=next_obs_raw, rnn_state=rnn_state.clone(), next_start=next_start)
    return next_obs, next_critic_obs


@torch.inference_mode()
def compute_advantages(agent: RecurrentAgent, rollout: RolloutBuffers, next_obs: torch.Tensor,
                       next_critic_obs: torch.Tensor | None, carry: dict, reward_scaler: RewardScaler,
                       args: Args) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the rollout (rewards scaled first with --norm-reward), bootstrapped with V(next_obs) after its last
    step and V(final_obs) where an episode was truncated, the critic's own observations where it has them. Returns
    (advantages, returns), (num_steps, num_envs)."""
    T, N = args.num_steps, args.num_envs
    # Bootstrap values read the carried state without advancing it: the next rollout continues
    # from rnn_state exactly as if this iteration's update had not happened in between.
    last_value = agent.get_value(next_obs, carry["rnn_state"], carry["next_start"], next_critic_obs)
    continuing = torch.zeros(T * N, dtype=torch.bool, device=next_obs.device)
    final_critic_obs = None if rollout.final_critic_obs is None else rollout.final_critic_obs.flatten(0, 1)
    final_values = agent.get_value(rollout.final_obs.flatten(0, 1), rollout.final_states.flatten(0, 1),
                                   continuing, final_critic_obs).view(T, N)
    dones = rollout.terminated | rollout.truncated
    rewards = reward_scaler(rollout.rewards, dones) if args.norm_reward else rollout.rewards
    return compute_gae(rewards, rollout.values, last_value, final_values, rollout.terminated, rollout.truncated,
                       args.gamma, args.gae_lambda)


@torch.no_grad()
def iteration_scalars(agent: RecurrentAgent, update_stats: dict, rollout: RolloutBuffers, obs_norm: ObsNormalizer,
                      critic_norm: ObsNormalizer | None, advantages: torch.Tensor, returns: torch.Tensor,
                      env_reports: dict) -> dict:
    """What shows a failing run (docs/design.md §4), nothing derivable: the update's losses and diagnostics, the
    value function's fit, the policy's noise and memory, the rollout's values, advantages and saturated observations,
    the envs' reports. Tensors, sent to the host in one transfer."""
    values, advantages, returns = rollout.values.flatten(), advantages.flatten(), returns.flatten()
    var_returns = returns.var()
    scalars = {
        **update_stats,
        "losses/explained_variance": 1 - (returns - values).var() / var_returns,
        "policy/action_std": agent.actor_logstd.exp().mean(),
        "values/mean": values.mean(), "values/std": values.std(),
        "values/returns_variance": var_returns,
        "advantages/mean": advantages.mean(), "advantages/std": advantages.std(), **env_reports,
        "debug/obs_clipped_share": obs_norm.clipped_share(rollout.obs),
        "policy/rnn_state_rms": rollout.states.square().mean().sqrt(),
    }
    if critic_norm is not None:  # --privileged-critic: its own observations, normalised apart
        scalars["debug/critic_obs_clipped_share"] = critic_norm.clipped_share(rollout.critic_obs)
    return scalars


def train(args: Args, on_iteration=None, typed_flags: set[str] | None = None) -> dict:
    """Trains, logs to runs/<run>/ and returns a summary: final returns, global step, run directory and the
    per-iteration metrics (`history`). Under torchrun, every process calls it; process 0 writes the run.
    `on_iteration(metrics)`, if given, sees each iteration's history entry (a sweep's pruner); an exception it
    raises ends the run, envs and logs closed. `typed_flags`: see flags_given (the command line passes them)."""
    args, rank, checkpoint, policy_device, (rollout_threads, update_threads) = start_run(args, typed_flags)
    # A warm start's checkpoint is read before the envs are built, so that a wrong path is told at once.
    initial = load_checkpoint(args.init_from, "--init-from") if args.init_from and checkpoint is None else None
    if initial is not None:
        args.init_from_steps = initial["global_step"] + initial["args"].get("init_from_steps", 0)
    # Under torchrun, process k's envs take the seeds after process k-1's: the same seeds as one process with them all.
    vec = make_env(args, args.num_envs, args.seed + rank * args.num_envs, policy_device,
                   render=args.capture_video and rank == 0)
    agent, obs_norm, critic_norm = build_agent(args, vec, policy_device)
    if args.privileged_critic and critic_norm is None:
        print(f"--privileged-critic: {args.env_id} has no critic observation (docs/tasks.md); the critic reads the "
              "policy's")
    if dist.is_initialized():  # every process starts from process 0's network
        for tensor in agent.state_dict().values():
            dist.broadcast(tensor, src=0)
    reward_scaler = RewardScaler(args.num_envs, args.gamma).to(policy_device)
    optimizer = make_optimizer(agent, args)
    adaptive_lr = args.anneal_lr and args.lr_schedule == "adaptive_kl"
    if args.compile:  # compiled random draws as in eager mode, so that a seed gives the same run with or without
        from torch._inductor import config as inductor_config

        inductor_config.fallback_random = True
    compiled = (lambda fn: torch.compile(fn, mode=args.compile_mode)) if args.compile else (lambda fn: fn)
    get_action_and_value, loss_fn = compiled(agent.get_action_and_value), compiled(ppo_loss)
    # What a checkpoint holds besides counters (Run): shared by all processes, each process's own, and where the
    # next rollout starts: the envs' last observation and the policy's memory of their episodes (restored with the
    # envs' state).
    stateful = {"model": agent, "optimizer": optimizer, "obs_normalizer": obs_norm}
    own_stateful = {"reward_scaler": reward_scaler}
    next_obs_raw, reset_info = vec.reset(seed=args.seed + rank * args.num_envs)
    carry = {"next_obs_raw": next_obs_raw,
             "rnn_state": agent.initial_state(args.num_envs),  # the state entering the next step, per env
             "next_start": torch.ones(args.num_envs, dtype=torch.bool, device=policy_device)}  # it starts an episode
    if critic_norm is not None:
        stateful["critic_obs_normalizer"] = critic_norm
        carry["next_critic_obs_raw"] = reset_info["critic_obs"]
    if initial is not None:
        warm_start(initial, args, stateful)
    if checkpoint is None:
        obs_norm.update(carry["next_obs_raw"])
        if critic_norm is not None:
            critic_norm.update(carry["next_critic_obs_raw"])
    global_step, start_iteration = restore(checkpoint, rank, vec, stateful, own_stateful, carry)

    T, N = args.num_steps, args.num_envs
    critic_obs_dim = 0 if critic_norm is None else vec.single_critic_observation_space.shape[0]
    rollout = RolloutBuffers.allocate(args, vec, agent.state_size, policy_device, critic_obs_dim)
    reports = RolloutReports(T, N, policy_device)
    run = Run(args, rank, policy_device, vec, stateful, own_stateful, carry, checkpoint, on_iteration)
    iteration, stopping, ended = start_iteration - 1, None, False
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            run.keep_last_completed(iteration - 1, global_step)
            if not adaptive_lr:
                for group in optimizer.param_groups:
                    group["lr"] = lr_fraction(args, iteration) * group["initial_lr"]
            run.start_video(iteration)
            rollout_start = time.perf_counter()
            reports.start()
            next_obs, next_critic_obs = collect_rollout(agent, get_action_and_value, obs_norm, critic_norm, vec,
                                                        rollout, carry, reports, run, global_step, iteration, args)
            advantages, returns = compute_advantages(agent, rollout, next_obs, next_critic_obs, carry, reward_scaler,
                                                     args)
            global_step += T * N * args.world_size
            rollout_time = elapsed_since(rollout_start)

            update_start = time.perf_counter()
            torch.set_num_threads(update_threads)
            batch = (rollout.obs, rollout.starts, rollout.actions, rollout.logprobs, rollout.values, advantages,
                     returns, rollout.critic_obs)
            update_stats, epochs_done = update(agent, optimizer, loss_fn, batch, rollout.states, args)
            stop_if_diverged(stateful, update_stats, iteration)
            update_time = elapsed_since(update_start)
            torch.set_num_threads(rollout_threads)
            eval_metrics = run.evaluate(iteration, agent, obs_norm)  # --eval-interval: the updated policy, deployed

            # Stop after the iteration where a signal had reached any process when they exchanged reports; one
            # arriving during or after the exchange stays in stop.signum for the next (not overwritten by None).
            merged, ended_returns, ended_lengths, stopping = reports.merged(run.stop.signum)
            scalars = iteration_scalars(agent, update_stats, rollout, obs_norm, critic_norm, advantages, returns,
                                        merged)
            run.log(iteration, global_step, scalars, ended_returns, ended_lengths, {
                "charts/learning_rate": optimizer.param_groups[0]["lr"], "time/rollout_s": rollout_time,
                "charts/update_epochs_done": epochs_done, "time/update_s": update_time,
                "charts/SPS": T * N * args.world_size / (rollout_time + update_time), **eval_metrics})
            run.save(iteration, global_step,
                     periodic=iteration % args.checkpoint_interval == 0 or iteration == args.num_iterations or stopping)
            if stopping:
                break
        ended = True
    except EnvStepError as error:
        run.save_after_env_error(error)
    finally:
        run.close(ended_in_every_process=ended)
    return run.summary(iteration, global_step, stopping)


class DeployedPolicy(nn.Module):
    """The policy as a robot runs it, what --export-checkpoint writes and --eval-checkpoint runs: a raw observation
    in, the action the env receives out (the frozen observation normaliser, the mean action, clip or tanh inside);
    the actor trunk's recurrent state (its hidden and, for an LSTM, cell state of every layer, flattened:
    `agent.actor_state_size`) is an input and an output, zeros at an episode's start."""

    memory_names = ("state",)

    def __init__(self, agent: RecurrentAgent, obs_norm: ObsNormalizer):
        super().__init__()
        self.agent, self.obs_norm = agent, obs_norm

    def initial_memory(self, batch: int, device: torch.device) -> list[torch.Tensor]:
        return [torch.zeros(batch, self.agent.actor_state_size, device=device)]

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.agent.actor_step(self.obs_norm(obs), state)


# ====================================================================================================================
# Below: run plumbing, the same in all three scripts (flag checks, torchrun, run directories, checkpoints,
# signals, logging, the command line). No need to read it to change the algorithm.
# ====================================================================================================================
class UsageError(ValueError):
    """Bad input (a flag, a checkpoint, the run directory): reported as one line naming the flag and the fix."""


def resolve_args(args: Args) -> Args:
    """Checks the flags and derives batch and sequence sizes."""
    if args.cuda:
        args.policy_device = args.sim_device = "cuda"
    check_flags(args, at_least_one=("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps",
                                     "rnn_hidden_size", "rnn_layers"))
    if not all(width >= 1 for width in args.scan_encoder_sizes):
        raise UsageError(f"--scan-encoder-sizes must be widths of at least 1, got {args.scan_encoder_sizes!r}")
    if args.bptt_len == 0:
        args.bptt_len = args.num_steps
    if args.bptt_len < 0 or args.num_steps % args.bptt_len:
        raise UsageError(
            f"--bptt-len {args.bptt_len} does not divide --num-steps {args.num_steps}; choose a divisor of "
            f"{args.num_steps}, or 0 for whole-rollout sequences"
        )
    # Under torchrun every process steps --num-envs envs and splits its own batch into --num-minibatches; their
    # gradients are averaged, so an optimiser step sees world_size minibatches and an iteration world_size batches.
    args.world_size = dist.get_world_size() if dist.is_initialized() else 1
    args.batch_size = args.num_envs * args.num_steps
    args.num_sequences = args.batch_size // args.bptt_len
    if args.num_sequences % args.num_minibatches:
        raise UsageError(
            f"the {args.num_sequences} sequences (--num-envs {args.num_envs} x --num-steps {args.num_steps} / "
            f"--bptt-len {args.bptt_len}) do not divide into --num-minibatches {args.num_minibatches}; choose a "
            f"divisor of {args.num_sequences}"
        )
    args.num_iterations = args.total_timesteps // (args.batch_size * args.world_size)
    if args.num_iterations < 1:
        raise UsageError(f"--total-timesteps {args.total_timesteps} is less than one batch "
                         f"({args.batch_size * args.world_size} steps)")
    check_advantage_steps(args)
    return args


def check_flags(args: Args, at_least_one: tuple[str, ...]) -> None:
    """Rejects out-of-range flags before anything is written."""
    # Every rate and coefficient finite first: inf passes "positive" (an infinite learning rate trained until stopped).
    floats = [f.name for f in fields(args) if isinstance(getattr(args, f.name), float)]
    rules = [(name, math.isfinite(getattr(args, name)), "a finite number") for name in floats] + [
        (name, getattr(args, name) >= 1, "at least 1") for name in at_least_one] + [
        ("seed", args.seed >= 0, "0 or more"),
        ("learning_rate", args.learning_rate > 0, "positive"),
        ("gamma", 0 <= args.gamma <= 1, "in [0, 1]"),
        ("gae_lambda", 0 <= args.gae_lambda <= 1, "in [0, 1]"),
        ("clip_coef", args.clip_coef > 0, "positive"),
        ("ent_coef", args.ent_coef >= 0, "0 or more"),
        ("vf_coef", args.vf_coef >= 0, "0 or more"),
        ("max_grad_norm", args.max_grad_norm > 0, "positive"),
        ("target_kl", args.target_kl >= 0, "0 (never stop early) or positive"),
        ("norm_obs_until", args.norm_obs_until >= 0, "0 (never freeze) or a number of observations"),
        ("norm_obs_eps", args.norm_obs_eps >= 0, "0 or more"),
        ("desired_kl", args.desired_kl > 0, "positive"),
        ("lr_min_fraction", 0 <= args.lr_min_fraction <= 1, "in [0, 1]"),
        ("critic_learning_rate", args.critic_learning_rate >= 0, "0 (--learning-rate) or positive"),
        ("weight_decay", args.weight_decay > 0 or args.optimizer != "adamw",
         "above 0 with --optimizer adamw (without decay AdamW is Adam; torch's AdamW default is 0.01)"),
        ("weight_decay", args.weight_decay >= 0, "0 or more"),
        ("huber_delta", args.huber_delta > 0, "positive"),
        ("hidden_sizes", all(width >= 1 for width in args.hidden_sizes), "widths of at least 1"),
        ("checkpoint_interval", args.checkpoint_interval >= 1, "at least 1"),
        ("video_interval", args.video_interval >= 1, "at least 1"),
        ("eval_episodes", args.eval_episodes >= 1, "at least 1"),
        ("eval_interval", args.eval_interval >= 0, "0 (no evaluation while training) or more"),
        ("exp_name", bool(args.exp_name) and "/" not in args.exp_name,
         "a non-empty name without '/' (it names the run dir)"),
        ("torch_threads", args.torch_threads >= 0, "0 (torch's default) or more"),
        ("update_threads", args.update_threads >= 0, "0 (torch's default) or more"),
        ("dist_timeout_s", args.dist_timeout_s >= 1, "at least 1"),
        ("compile_mode", args.compile or args.compile_mode == "default", "used with --compile (add --compile)"),
    ]
    for name, ok, requirement in rules:
        if not ok:
            raise UsageError(f"--{name.replace('_', '-')} must be {requirement}, got {getattr(args, name)!r}")


def check_advantage_steps(args: Args) -> None:
    """--norm-adv over a single step divides by the std of one number, NaN: every weight NaN after the first update,
    and the run going on as if nothing were wrong (the NaN actions read as env blow-ups)."""
    per_minibatch = args.norm_adv_per_minibatch
    steps = (args.batch_size // args.num_minibatches if per_minibatch else args.batch_size) * args.world_size
    if args.norm_adv and steps < 2:
        fix = "lower --num-minibatches, raise" if per_minibatch else "raise"
        raise UsageError(f"--norm-adv normalises advantages over {'a minibatch' if per_minibatch else 'the batch'} "
                         f"of {steps} step (the std of one number is NaN): {fix} --num-envs or --num-steps, or give "
                         "--no-norm-adv")


def pick_device(name: str, flag: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{flag} cuda (or --cuda) was given but torch sees no CUDA GPU; use {flag} cpu")
    return torch.device(name)


# What a resumed run may be told anew: where it runs, for how long, how it shows its progress. Everything else is the
# checkpoint's; another value given for it is refused (one line naming the flag), never silently dropped.
RESUME_MAY_CHANGE = ("total_timesteps", "progress_bar", "torch_threads", "update_threads", "dist_timeout_s")
DEVICE_FLAGS = ("cuda", "policy_device", "sim_device")


def flags_given(args: Args, ignored: tuple[str, ...], typed_flags: set[str] | None = None) -> dict:
    """The flags given in `args`, but for `ignored`: those typed on the command line (`typed_flags`, from
    flags_typed), or, where a caller built Args itself (None), those away from the script's defaults. The command
    line's own names count, so that a flag typed with the default's value (`--total-timesteps` with the script's
    default, to lengthen a shorter run) is not taken for one left out."""
    defaults = Args()
    return {f.name: getattr(args, f.name) for f in fields(Args) if f.name not in ignored and (
        f.name in typed_flags if typed_flags is not None else getattr(args, f.name) != getattr(defaults, f.name))}


def flags_typed(argv: list[str]) -> set[str]:
    """The Args fields a command line names (`--num-envs 8`, `--num-envs=8`, `--no-norm-obs`)."""
    names = {f.name for f in fields(Args)}
    typed = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            typed.add(name if name in names else name.removeprefix("no_"))
    return typed & names


def resumed_args(args: Args, checkpoint: dict, typed_flags: set[str] | None = None) -> Args:
    """The checkpoint's flags, with those given in `args` (see flags_given) that a resume may change."""
    saved = args_from_checkpoint(checkpoint)
    not_flags = ("resume", "eval_checkpoint", "export_checkpoint", "world_size", "batch_size", "minibatch_size",
                 "num_iterations", "init_from_steps")
    changed = {name: value for name, value in flags_given(args, not_flags, typed_flags).items()
               if value != getattr(saved, name)}
    may_change = ", ".join("--" + name.replace("_", "-") for name in RESUME_MAY_CHANGE)
    for name, value in changed.items():
        if name not in RESUME_MAY_CHANGE + DEVICE_FLAGS:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {value!r}: the run being resumed has {getattr(saved, name)!r}; a resumed run "
                             f"keeps its flags but for {may_change} and the devices (start a new run to change {flag})")
    # The devices go together (a GPU run resumed on a CPU machine: --policy-device cpu --sim-device cpu).
    if any(name in changed for name in DEVICE_FLAGS):
        changed.update({name: getattr(args, name) for name in DEVICE_FLAGS})
    return dataclasses.replace(saved, **changed, resume=args.resume)


def start_run(args: Args, typed_flags: set[str] | None = None
              ) -> tuple[Args, int, dict | None, torch.device, tuple[int, int]]:
    """What comes before any env: torchrun's process group, the checkpoint to resume (whose flags then replace
    these, but for those a resume may change), the flags checked, the devices, the seed and the threads. Returns the
    flags, this process's rank, the checkpoint (or None), the policy's device and the (rollout, update) threads."""
    rank = init_distributed(args)
    checkpoint = load_checkpoint(args.resume, "--resume") if args.resume else None
    if checkpoint is not None:
        if "torch_rng" not in checkpoint:  # written before checkpoints were one dict of stateful objects
            raise UsageError(f"--resume {args.resume}: a checkpoint of an older version of this script, which cannot "
                             "be continued; it still evaluates (--eval-checkpoint), or start a new run")
        args = resumed_args(args, checkpoint, typed_flags)
    args = resolve_args(args)
    policy_device = pick_device(args.policy_device, "--policy-device")
    pick_device(args.sim_device, "--sim-device")
    if checkpoint is not None and checkpoint.get("world_size", 1) != args.world_size:
        raise UsageError(f"--resume {args.resume}: written by {checkpoint.get('world_size', 1)} processes, resumed by "
                         f"{args.world_size}; resume with torchrun --nproc-per-node {checkpoint.get('world_size', 1)}")
    if checkpoint is not None and checkpoint["iteration"] >= args.num_iterations:
        raise UsageError(f"--resume {args.resume}: the run already has {checkpoint['global_step']:,} steps, all "
                         f"that --total-timesteps {args.total_timesteps:,} asks for; give a larger one to go on")
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    threads = (args.torch_threads or torch.get_num_threads(), args.update_threads or torch.get_num_threads())
    torch.set_num_threads(threads[0])
    return args, rank, checkpoint, policy_device, threads


def mean_std_over_processes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (unbiased) std of the minibatches of all processes together under torchrun: the same normalised
    advantages as one process with all the data."""
    sums = torch.stack([torch.tensor(x.numel(), dtype=torch.float64, device=x.device), x.double().sum(),
                        x.double().square().sum()])
    dist.all_reduce(sums)
    count, total, total_squares = sums
    mean = total / count
    return mean.float(), ((total_squares - count * mean.square()) / (count - 1)).clamp(min=0.0).sqrt().float()


# Data-parallel training under torchrun, as rsl_rl's and CleanRL's multi-GPU PPO: each process steps its own envs,
# every minibatch's gradients are averaged over the processes, the normalisers merge everyone's data, process 0 logs
# and saves. Without torchrun (WORLD_SIZE unset) nothing here touches torch.distributed.


def init_distributed(args: Args) -> int:
    """Under torchrun, joins its process group (NCCL for a CUDA policy with a GPU per process, gloo otherwise; each
    process on its own GPU, or sharing them in turn) and returns this process's rank; 0 without torchrun."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.get_rank() if dist.is_initialized() else 0
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:  # more processes than GPUs share them in turn; Genesis also builds on the current GPU
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % gpus)
    cuda = args.cuda or args.policy_device == "cuda" or (args.policy_device == "auto" and gpus > 0)
    # NCCL refuses two processes on one GPU; gloo reduces CUDA tensors too, through the host
    one_gpu_each = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= gpus
    backend = "nccl" if cuda and one_gpu_each else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.dist_timeout_s))
    return dist.get_rank()


def average_over_processes(tensors: list[torch.Tensor]) -> None:
    """Each tensor becomes, in place, its mean over the processes: one all-reduce of them all, flattened."""
    if dist.is_initialized():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for tensor, chunk in zip(tensors, flat.split([t.numel() for t in tensors])):
            tensor.copy_(chunk.view_as(tensor))


def gather_processes(obj) -> list:
    """[obj of process 0, obj of process 1, ...] on every process; [obj] without torchrun."""
    if not dist.is_initialized():
        return [obj]
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, obj)
    return objs


def merge_processes(parts: dict) -> dict:
    """An iteration's `parts` of every process together (every process passes the same keys): ended episodes
    ("episodes/...") concatenated, "stop" the first signal any process received, reward terms averaged, other
    tensors (sums) added. Without torchrun: `parts` as they are."""
    if not dist.is_initialized():
        return parts
    gathered = gather_processes({k: v.cpu() if torch.is_tensor(v) else v for k, v in parts.items()})
    merged = {}
    for key in parts:
        values = [part[key] for part in gathered]
        if key == "stop":
            merged[key] = next((v for v in values if v is not None), None)
        elif key.startswith("episodes/"):
            merged[key] = torch.cat(values)
        else:
            merged[key] = torch.stack(values).sum(0) / (len(values) if key.startswith("reward_terms/") else 1)
    return merged


CHECKPOINT_KIND = "ppo_recurrent"  # written into every checkpoint: another script's checkpoint is refused clearly
# What a run's last lines tell the user to run again (evaluate, resume): this file, or the command of a benchmark
# that runs it with one thing changed (benchmarks/*_variants.py), which the plain script would drop
LAUNCHED_AS = f"{CHECKPOINT_KIND}.py"


class EnvStepError(RuntimeError):
    """The env raised inside `step`: the run stops with its last completed iteration saved."""


class TrainingDiverged(RuntimeError):
    """An update left NaN or inf in the network or a normaliser: the run stops rather than train on (silently: the
    NaN actions would read as env blow-ups, every episode one step long, until the last iteration)."""


def stop_if_diverged(stateful: dict, update_stats: dict, iteration: int) -> None:
    """Raises TrainingDiverged when a weight of the network or a statistic of a normaliser (of the checkpoint's
    `stateful`) is not finite after iteration's update, before anything of it is logged or saved: one host sync per
    iteration. Under torchrun the processes hold the same network and normalisers, so all stop at the same iteration."""
    tensors = {f"{key}.{name}": tensor for key, module in stateful.items() if isinstance(module, nn.Module)
               for name, tensor in (module.named_buffers() if isinstance(module, RunningMeanStd)
                                    else module.named_parameters())}
    if torch.stack([tensor.isfinite().all() for tensor in tensors.values()]).all():
        return
    broken = [name for name, tensor in tensors.items() if not tensor.isfinite().all()]
    losses = ", ".join(f"{key.removeprefix('losses/')} {float(value.detach()):.3g}"
                       for key, value in update_stats.items()
                       if key in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl"))
    raise TrainingDiverged(
        f"training diverged: iteration {iteration}'s update left NaN or inf in {', '.join(broken[:3])}"
        f"{' and more' if len(broken) > 3 else ''} (its mean {losses}); nothing of it is logged or saved (a "
        "checkpoint, if any, holds an earlier iteration): start a new run with a lower --learning-rate or "
        "--max-grad-norm, or check the task's rewards and observations")


def create_run_dir(args: Args) -> str:
    """runs/{env_id}__{exp_name}__{seed}__{unix_time}, created atomically: a run started in the same second
    (a job array, a sweep) gets the next free suffix (_1, _2, ...) instead of sharing a directory."""
    base = os.path.join("runs", f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
    if os.path.exists("runs") and not os.path.isdir("runs"):
        raise UsageError(f"{os.path.abspath('runs')} is a file, not a directory: move it, or run from elsewhere")
    try:
        os.makedirs("runs", exist_ok=True)
        for attempt in range(10_000):
            path = base if attempt == 0 else f"{base}_{attempt}"
            try:
                os.mkdir(path)
                return path
            except FileExistsError:
                continue
    except OSError as error:
        raise UsageError(f"cannot create a run directory in {os.path.abspath('runs')} ({error.strerror}): run from a "
                         "directory where runs/ can be written") from None
    raise UsageError(f"{base}: 10,000 runs of this name started in the same second; vary --exp-name")


def run_dir_of(checkpoint_path: str) -> str:
    """A resumed run continues in the directory that holds its checkpoint (wherever the run was moved)."""
    path = os.path.normpath(checkpoint_path)
    return path if os.path.isdir(path) else (os.path.dirname(path) or ".")


class CheckpointNotWritten(RuntimeError):
    """A checkpoint could not be written (a full disk, a quota, a lost mount): the run stops, its earlier
    checkpoints whole."""


def save_checkpoint(run_dir: str, state: dict, names: tuple[str, ...] = ()) -> str:
    """Writes `state` as checkpoint_<iteration>.pt and checkpoint.pt (the latest), or as `names`; returns the first
    one's path. Atomic: a crash mid-write leaves the previous checkpoints intact; a write that fails removes its
    temporary files (a full disk stays no fuller) and raises CheckpointNotWritten saying how to go on."""
    paths = [os.path.join(run_dir, name) for name in names or (f"checkpoint_{state['iteration']:06d}.pt",
                                                               "checkpoint.pt")]
    try:
        torch.save(state, paths[0] + ".tmp")
        for path in paths[1:]:
            shutil.copyfile(paths[0] + ".tmp", path + ".tmp")
        for path in paths:
            os.replace(path + ".tmp", path)
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        latest = os.path.join(run_dir, "checkpoint.pt")
        how = (f"the checkpoints before it are whole: make room, then --resume {run_dir}" if os.path.exists(latest)
               else "none was written before it: make room and start the run again")
        raise CheckpointNotWritten(f"could not write {paths[0]} ({reason}) at iteration {state['iteration']}; "
                                   f"{how}") from None
    finally:
        for path in paths:
            if os.path.exists(path + ".tmp"):
                os.remove(path + ".tmp")
    return paths[0]


def load_checkpoint(path: str, flag: str) -> dict:
    """The checkpoint at `path` (a checkpoint file or a run directory), or a UsageError naming `flag`."""
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint.pt")
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path}: no checkpoint there; pass a checkpoint.pt or a run directory from runs/")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, not a torch file, or pickled code that weights_only refuses
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UsageError(f"{flag} {path}: not a readable checkpoint ({reason}); pass a checkpoint written by "
                         f"{CHECKPOINT_KIND}.py, e.g. the run's checkpoint.pt or an earlier checkpoint_*.pt") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("args"), dict):
        raise UsageError(f"{flag} {path}: not a checkpoint of these scripts; pass a checkpoint.pt from runs/")
    written_by = checkpoint.get("script", CHECKPOINT_KIND)  # checkpoints from before it was recorded: trusted
    if written_by != CHECKPOINT_KIND:
        raise UsageError(f"{flag} {path}: written by {written_by}.py, not {CHECKPOINT_KIND}.py; run {written_by}.py "
                         f"{flag} {path} instead")
    return checkpoint


def args_from_checkpoint(checkpoint: dict) -> Args:
    saved = {f.name: checkpoint["args"][f.name] for f in fields(Args) if f.name in checkpoint["args"]}
    # JSON (an exported model's metadata) gives tuples back as lists: --hidden-sizes, --env-kwargs' (low, high) ranges
    if saved.get("env_kwargs"):
        saved["env_kwargs"] = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["env_kwargs"].items()}
    return Args(**{name: tuple(value) if isinstance(value, list) else value for name, value in saved.items()})


def restore(checkpoint: dict | None, rank: int, vec, stateful: dict, own_stateful: dict,
            carry: dict) -> tuple[int, int]:
    """Loads what Run.save wrote into the run's objects; returns (global_step, first iteration), (0, 1) with no
    checkpoint. `carry` loads with the envs' state or not at all: a task that cannot save its envs starts afresh."""
    if checkpoint is None:
        return 0, 1
    own = checkpoint if rank == 0 else checkpoint["other_processes"][rank - 1]
    for key, obj in stateful.items():
        obj.load_state_dict(checkpoint[key])
    for key, obj in own_stateful.items():
        obj.load_state_dict(own[key])
    torch.set_rng_state(own["torch_rng"])
    if own.get("cuda_rng") is not None and torch.cuda.is_available():  # a CUDA policy's action noise and shuffles
        torch.cuda.set_rng_state(own["cuda_rng"])
    env_state, why_fresh = own["env"], "this task's env state was not saved"
    # A task that keeps more than it did when the checkpoint was written (envs/ changed since) cannot be given the old
    # state; it is checked before anything is loaded, so the envs are still as their reset left them.
    missing = [] if env_state is None else sorted(set(vec.state_dict()) - set(env_state))
    if missing:
        env_state, why_fresh = None, f"the saved env state lacks {', '.join(missing)} (an older envs/ wrote it)"
    if env_state is not None:
        vec.load_state_dict(env_state)
        for key, value in carry.items():
            if isinstance(value, torch.Tensor):
                carry[key] = own[key].to(value.device)
            else:
                value.load_state_dict(own[key])
    else:
        print(f"[resume] {why_fresh}: envs start from a fresh reset")
    return checkpoint["global_step"], checkpoint["iteration"] + 1


def warm_start(initial: dict, args: Args, stateful: dict) -> None:
    """--init-from: the network and observation normalisers of another run's checkpoint, as rsl_rl and legged_gym
    load a trained policy into a new run (a curriculum by hand, a task changed under the same observations). The
    optimizer starts afresh, as do the counters and the reward scaler; the action's bounds are this run's task's (a
    tighter limit trains the policy within it). A UsageError if the two do not fit; the flags
    that differ from that run's are listed (a network flag that changes no shape, --num-heads or --activation, loads
    without complaint and computes something else)."""
    def shape(state: dict, name: str) -> str:
        return "absent" if name not in state else "x".join(map(str, state[name].shape)) or "scalar"

    for key, obj in stateful.items():
        if key == "optimizer":
            continue
        here, there = obj.state_dict(), initial.get(key, {})
        differ = [f"{key}.{name} {shape(there, name)} there, {shape(here, name)} here"
                  for name in sorted(here.keys() | there.keys()) if shape(there, name) != shape(here, name)]
        if differ:
            raise UsageError(f"--init-from {args.init_from}: its network does not fit this run's "
                             f"({'; '.join(differ[:3])}); give the network's and the task's flags of the run it comes "
                             "from (its args.json)")
        if key == "model":  # the action's bounds are the task's, not learnt: this run's own (another --env-kwargs)
            there = {**there, "action_low": here["action_low"], "action_high": here["action_high"]}
        obj.load_state_dict(there)
    source = args_from_checkpoint(initial)
    not_flags = ("resume", "init_from", "world_size", "batch_size", "minibatch_size", "num_iterations", "num_sequences",
                 "init_from_steps")
    unlike = ["--" + f.name.replace("_", "-") for f in fields(Args)
              if f.name not in not_flags and getattr(args, f.name) != getattr(source, f.name)]
    print(f"[init-from] {args.init_from}: its network and observation normalisers; flags unlike its run's: "
          f"{', '.join(unlike) or 'none'}")
    if initial["args"].get("init_from") and "init_from_steps" not in initial["args"]:
        print(f"[init-from] its run was itself warm-started (from {initial['args']['init_from']}) before runs kept "
              f"the steps behind their networks: init_from_steps counts its {initial['global_step']:,} steps alone")


class StopSignal:
    """SIGINT (Ctrl-C) and SIGTERM (Slurm, Kubernetes, `timeout`) ask the run to finish its iteration, save a
    checkpoint and exit: `signum` is the first one received (None until then); a second Ctrl-C aborts. Installed
    until `restore()`, in the main thread only (the only one Python delivers signals to)."""

    def __init__(self):
        self.signum, self.previous = None, {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self.request) for signum in (signal.SIGINT, signal.SIGTERM)}

    def request(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            print(f"\n{signal.Signals(signum).name}: finishing this iteration, then saving a checkpoint (Ctrl-C again "
                  "aborts)", flush=True)
            self.signum = signum

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def open_logs(args: Args, run_dir: str, resumed_at: int | None):
    """TensorBoard's writer and, with --track, the W&B run; a new run also records its flags (a text table and
    args.json). A resumed run drops what was logged after its checkpoint (no step logged twice or going back)."""
    writer = SummaryWriter(run_dir, purge_step=None if resumed_at is None else resumed_at + 1)
    if resumed_at is None:
        table = "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        with open(os.path.join(run_dir, "args.json.tmp"), "w") as f:
            json.dump(asdict(args), f, indent=2)
        os.replace(os.path.join(run_dir, "args.json.tmp"), os.path.join(run_dir, "args.json"))
    if not args.track:
        return writer, None
    import wandb

    # Every scalar goes to W&B directly, under its TensorBoard name and against global_step (W&B's sync_tensorboard
    # watches the event files and was seen to miss the last iterations of a run, or all of a short one). W&B's own
    # files go to ./wandb (or $WANDB_DIR), outside runs/.
    run_name = os.path.basename(os.path.abspath(run_dir))
    run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, group=args.wandb_group,
                     config=asdict(args), name=run_name, resume="allow", id=run_name)
    run.define_metric("global_step")
    run.define_metric("*", step_metric="global_step")
    return writer, run


def step_envs(vec, action: torch.Tensor, env_id: str, global_step: int, iteration: int):
    """vec.step; an exception of the env becomes an EnvStepError that says where (the run saves and stops)."""
    try:
        return vec.step(action)
    except Exception as error:
        message = (str(error).strip().splitlines() or [""])[0][:200]
        raise EnvStepError(f"{env_id} raised {type(error).__name__} ({message}) in step at global step {global_step}, "
                           f"iteration {iteration}") from error


def video_saved(path: str, wandb_run, global_step: int) -> None:
    print(f"saved {path}")
    if wandb_run is not None:
        import wandb

        wandb_run.log({"videos/train": wandb.Video(path, format="mp4"), "global_step": global_step})


def elapsed_since(start: float) -> float:
    """Seconds since `start` (a time.perf_counter() reading) once the GPU has done the work queued so far: CUDA runs
    asynchronously, so a phase's queued kernels would otherwise be timed in the next phase that waits for them."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def show_progress(progress, metrics: dict, recent_returns: list[float]) -> None:
    """One iteration on the tqdm bar, with SPS, the mean of the last 100 returns and the success rate."""
    progress.update(1)
    postfix = {"SPS": f"{metrics['charts/SPS']:.0f}"}
    if recent_returns:
        postfix["return"] = f"{np.mean(recent_returns):.1f}"
    if "charts/success_rate" in metrics:
        postfix["success"] = f"{metrics['charts/success_rate']:.2f}"
    progress.set_postfix(postfix)


class RolloutReports:
    """What the envs report during a rollout besides observations and rewards: the episodes that ended (return,
    length, success), the tasks' own metrics of those episodes, the reward terms and the simulator errors."""

    def __init__(self, num_steps: int, num_envs: int, device: torch.device):
        buf = lambda dtype=torch.float32: torch.zeros((num_steps, num_envs), dtype=dtype, device=device)  # noqa: E731
        self.returns, self.lengths, self.ended, self.success = buf(), buf(), buf(torch.bool), buf(torch.bool)
        self.sim_errors, self.num_steps = buf(torch.bool), num_steps
        self.has_success = False  # tasks with a success criterion report it in info["success"] (logged as a rate)

    def start(self) -> None:
        self.metric_steps, self.term_steps = [], []  # per step that reported them: (step, names, values stacked)

    def record(self, step: int, info: dict) -> None:
        """Copies the step's reports; they are reduced once a rollout (`merged`): on a GPU each op is a kernel
        launch, and reducing every metric and reward term every step made 44 of the 111 ops of a Go2 rollout step."""
        episode = info["episode"]
        self.returns[step], self.lengths[step], self.ended[step] = episode["r"], episode["l"], episode["mask"]
        self.sim_errors[step] = info["sim_errors"]
        if "success" in info:
            self.has_success, self.success[step] = True, info["success"]
        for reported, steps in ((info.get("episode_metrics"), self.metric_steps),
                                (info.get("reward_terms"), self.term_steps)):
            if reported:
                steps.append((step, tuple(reported), torch.stack(list(reported.values()))))

    def reduced(self) -> tuple[dict, dict, dict]:
        """Per episode metric its sum and count over the episodes that ended with it (NaN: a metric that does not
        apply to that episode), and per reward term its sum over the steps of its per-step means over the envs.
        The steps that reported the same names (all of them, for a task's constant names) are reduced together."""
        metric_sums, metric_counts, term_sums = {}, {}, {}
        for names, steps, values in self.grouped(self.metric_steps):
            counted = torch.stack([self.ended[step] for step in steps])[:, None] & ~values.isnan()
            for name, total, count in zip(names, torch.where(counted, values, 0.0).sum((0, 2)), counted.sum((0, 2))):
                metric_sums[name] = metric_sums.get(name, 0.0) + total
                metric_counts[name] = metric_counts.get(name, 0) + count
        for names, _, values in self.grouped(self.term_steps):
            for name, total in zip(names, values.mean(-1).sum(0)):
                term_sums[name] = term_sums.get(name, 0.0) + total
        return metric_sums, metric_counts, term_sums

    @staticmethod
    def grouped(reports: list) -> list:
        """[(names, steps, their values stacked: (steps, names, envs))] from record's (step, names, values)."""
        groups = {}
        for step, names, values in reports:
            steps, stacked = groups.setdefault(names, ([], []))
            steps.append(step)
            stacked.append(values)
        return [(names, steps, torch.stack(stacked)) for names, (steps, stacked) in groups.items()]

    def merged(self, stop_signum):
        """The rollout's reports of every process (torchrun) as scalars to log, the ended episodes' returns and
        lengths, and the first stop signal any process received (a signal may reach them at different steps)."""
        metric_sums, metric_counts, term_sums = self.reduced()
        merged = merge_processes({
            "episodes/r": self.returns[self.ended], "episodes/l": self.lengths[self.ended],
            **({"episodes/success": self.success[self.ended]} if self.has_success else {}),
            **{f"episode_metrics/{k}": v for k, v in metric_sums.items()},
            **{f"episode_metric_counts/{k}": v for k, v in metric_counts.items()},
            **{f"reward_terms/{k}": v / self.num_steps for k, v in term_sums.items()},
            "env/sim_errors": self.sim_errors.sum().float(), "stop": stop_signum,
        })
        stop_signum = merged.pop("stop")
        ended_returns, ended_lengths = merged.pop("episodes/r"), merged.pop("episodes/l")
        if self.has_success:
            merged["charts/success_rate"] = merged.pop("episodes/success").float().mean()
        for name in metric_sums:  # each metric's mean over the episodes it applies to (NaN if none)
            merged[f"episode_metrics/{name}"] = merged[f"episode_metrics/{name}"] / merged.pop(
                f"episode_metric_counts/{name}")
        return merged, ended_returns, ended_lengths, stop_signum


def write_logs(writer, wandb_run, metrics: dict, finished: list[list[float]], global_step: int) -> None:
    """An iteration's scalars to TensorBoard and W&B; each ended episode's return and length to TensorBoard (one
    point per episode, as CleanRL logs them: benchmarks reduce over the last 100), their mean to W&B and into
    `metrics` (the run's history)."""
    for key, value in metrics.items() if writer is not None else ():
        writer.add_scalar(key, value, global_step)
    if writer is not None and finished[0]:
        # The iteration's episodes in one event: an add_scalar each (30 us) made 80 ms of the 1400 episodes that
        # 4096 robots falling every 70 steps end in an iteration.
        points = [Summary.Value(tag="charts/episodic_return", simple_value=value) for value in finished[0]]
        points += [Summary.Value(tag="charts/episodic_length", simple_value=value) for value in finished[1]]
        writer.file_writer.add_summary(Summary(value=points), global_step)
    if finished[0]:
        metrics["charts/episodic_return"], metrics["charts/episodic_length"] = map(np.mean, finished)
    if wandb_run is not None:
        wandb_run.log({**metrics, "global_step": global_step})


class Run:
    """A training run's plumbing: its directory, logs, progress bar, training videos, stop signal and checkpoints
    (process 0's alone under torchrun), and the history train() returns.

    A checkpoint holds `stateful` (shared by all processes under torchrun, identical in each) and each process's own
    `own_stateful`, torch RNG, envs' state and `carry` (where the next rollout starts: tensors, or objects with a
    state_dict), process 0's at the top level and the others' in "other_processes", and the best evaluation so far.
    `checkpoint`: the one the run resumes from, or None."""

    def __init__(self, args: Args, rank: int, device: torch.device, vec, stateful: dict, own_stateful: dict,
                 carry: dict, checkpoint: dict | None, on_iteration=None):
        self.args, self.rank, self.device, self.vec = args, rank, device, vec
        self.stateful, self.own_stateful, self.carry = stateful, own_stateful, carry
        resumed_at = None if checkpoint is None else checkpoint["global_step"]
        self.run_dir, self.writer, self.wandb_run = None, None, None  # process 0's alone under torchrun
        if rank == 0:
            try:  # only now, with the flags, the checkpoint and the env accepted: a rejected run leaves nothing behind
                self.run_dir = run_dir_of(args.resume) if resumed_at is not None else create_run_dir(args)
            except UsageError:
                vec.close()
                raise
            self.writer, self.wandb_run = open_logs(args, self.run_dir, resumed_at)
        self.on_iteration, self.history, self.recent_returns = on_iteration, [], []
        self.last_completed = None  # what the last completed iteration left: saved if the env fails in a rollout
        self.stop = StopSignal()
        self.progress = None
        if args.progress_bar and rank == 0:
            from tqdm import tqdm

            done = 0 if checkpoint is None else checkpoint["iteration"]
            self.progress = tqdm(total=args.num_iterations, initial=done, unit="it", dynamic_ncols=True)
        # --eval-interval: process 0's evaluation envs (made at the first evaluation), the best evaluation so far
        # ({"iteration", "score"}; a resumed run remembers it) and whether this iteration's beat it.
        self.eval_vec, self.new_best = None, False
        self.best_eval = None if checkpoint is None else checkpoint.get("best_eval")
        self.recorder = EpisodeRecorder() if args.capture_video and rank == 0 else None

    def own_state(self) -> dict:
        try:
            env_state = self.vec.state_dict()
        except NotImplementedError:
            env_state = None
        return {"torch_rng": torch.get_rng_state(), "env": env_state,
                "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
                **{key: value.cpu() if isinstance(value, torch.Tensor) else value.state_dict()
                   for key, value in self.carry.items()},
                **{key: obj.state_dict() for key, obj in self.own_stateful.items()}}

    def checkpoint_state(self, iteration: int, global_step: int, own_states: list[dict]) -> dict:
        return {"script": CHECKPOINT_KIND, "args": asdict(self.args), "global_step": global_step,
                "iteration": iteration, "world_size": self.args.world_size, "best_eval": self.best_eval,
                **own_states[0], "other_processes": own_states[1:],
                **{key: obj.state_dict() for key, obj in self.stateful.items()}}

    def keep_last_completed(self, iteration: int, global_step: int) -> None:
        if self.args.world_size == 1:  # under torchrun the other processes' states are out of reach
            self.last_completed = copy.deepcopy(self.checkpoint_state(iteration, global_step, [self.own_state()]))

    def save(self, iteration: int, global_step: int, periodic: bool = True) -> None:
        """The `periodic` checkpoint, and checkpoint_best.pt after an evaluation that beat all before it (a whole
        checkpoint: it evaluates, exports and resumes; written atomically). Every process calls it (a collective)."""
        if not (periodic or self.new_best):
            return
        own_states = gather_processes(self.own_state())
        if self.rank == 0:
            state = self.checkpoint_state(iteration, global_step, own_states)
            if periodic:
                save_checkpoint(self.run_dir, state)
            if self.new_best:
                save_checkpoint(self.run_dir, state, ("checkpoint_best.pt",))

    def evaluate(self, iteration: int, agent: nn.Module, obs_norm: ObsNormalizer) -> dict:
        """--eval-interval: on the iterations it names and the last, process 0 runs --eval-episodes episodes of the
        policy as deployed (`run_episodes`, the same episodes each time) on envs of its own while the others wait.
        Torch's RNG is forked around it, so that training draws the same numbers with evaluation as without. Returns
        the eval/* metrics (process 0's; none on the others) and marks a new best, by the success rate (then the
        return) where the task reports success, else by the return, for `save` (decided on process 0, for all)."""
        args, self.new_best = self.args, False
        if not args.eval_interval or (iteration % args.eval_interval and iteration != args.num_iterations):
            return {}
        metrics, score = {}, None
        if self.rank == 0:
            started = time.perf_counter()
            with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
                try:
                    if self.eval_vec is None:
                        self.eval_vec = evaluation_envs(args, args.eval_episodes, self.device)
                    result = run_episodes(DeployedPolicy(agent, obs_norm), self.eval_vec, args.eval_episodes,
                                          args.seed + EVAL_SEED_OFFSET)
                except Exception as error:  # noqa: BLE001 - the task's code failed: reported as the training envs'
                    raise EnvStepError(f"{args.env_id}: the evaluation envs raised at iteration {iteration} "
                                       f"({type(error).__name__}: {error})") from error
            metrics = {EVAL_NAMES.get(key, f"eval/{key}"): value for key, value in result.items() if key != "episodes"}
            metrics["time/eval_s"] = elapsed_since(started)
            score = [result["success_rate"], result["mean_return"]] if "success_rate" in result else [
                result["mean_return"]]
        if dist.is_initialized():
            shared = [score]
            dist.broadcast_object_list(shared, src=0)
            score = shared[0]
        self.new_best = self.best_eval is None or score > self.best_eval["score"]
        if self.new_best:
            self.best_eval = {"iteration": iteration, "score": score}
        return metrics

    def save_after_env_error(self, error: EnvStepError) -> None:
        """Saves the last completed iteration and the env's traceback, then raises the error with how to go on."""
        if self.last_completed is None:  # torchrun: the last checkpoint stands
            raise error
        path = save_checkpoint(self.run_dir, self.last_completed)
        with open(os.path.join(self.run_dir, "error.txt"), "w") as f:
            traceback.print_exception(error.__cause__, file=f)
        raise EnvStepError(f"{error}; its traceback is in {os.path.join(self.run_dir, 'error.txt')}; the last "
                           f"completed iteration ({self.last_completed['iteration']}) is saved: fix the env, then "
                           f"--resume {path}") from None

    def start_video(self, iteration: int) -> None:
        if self.recorder is not None and (iteration - 1) % self.args.video_interval == 0:
            self.recorder.start()

    def record_video(self, done: torch.Tensor, global_step: int, steps_done: int) -> None:
        path = os.path.join(self.run_dir, "videos", f"train_{global_step + steps_done}.mp4")
        if self.recorder.step(self.vec, done, path):
            video_saved(path, self.wandb_run, global_step)

    def log(self, iteration: int, global_step: int, scalars: dict, ended_returns: torch.Tensor,
            ended_lengths: torch.Tensor, host_metrics: dict) -> None:
        """The iteration's `scalars` (tensors, one host transfer) and `host_metrics` to TensorBoard, W&B, the
        progress bar and the history; each ended episode's return and length to TensorBoard."""
        finished = torch.stack([ended_returns, ended_lengths]).cpu().tolist()
        metrics = dict(zip(scalars, torch.stack([torch.as_tensor(v, dtype=torch.float64).to(self.device)
                                                 for v in scalars.values()]).cpu().tolist()))
        metrics.update(host_metrics)
        if not finished[0]:  # no episode ended: no success rate or task metric (the mean of nothing is NaN)
            metrics = {k: v for k, v in metrics.items() if not k.startswith(("charts/success", "episode_metrics/"))}
        # A task metric that applied to none of the ended episodes (a terrain type nobody finished on): left out.
        metrics = {k: v for k, v in metrics.items() if not (k.startswith("episode_metrics/") and math.isnan(v))}
        write_logs(self.writer, self.wandb_run, metrics, finished, global_step)
        self.recent_returns = (self.recent_returns + finished[0])[-100:]
        self.history.append({"iteration": iteration, "global_step": global_step, **metrics})
        if self.on_iteration is not None:
            self.on_iteration(self.history[-1])
        if self.progress is not None:
            show_progress(self.progress, metrics, self.recent_returns)

    def close(self, ended_in_every_process: bool) -> None:
        """Flushes and closes what the run opened. Under torchrun, a run that ended in every process (its last
        iteration, or a stop signal) waits here for the others before leaving: torchrun ends the other processes as
        soon as one exits with a failure status (a run stopped by a signal exits with 128 + its number), and process
        0 may still be writing the last checkpoint and logs."""
        self.stop.restore()
        if self.progress is not None:
            self.progress.close()
        if self.writer is not None:
            self.writer.close()
        self.vec.close()
        if self.eval_vec is not None:
            self.eval_vec.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if dist.is_initialized():
            if ended_in_every_process:
                dist.barrier()
            dist.destroy_process_group()

    def summary(self, iteration: int, global_step: int, stopped_by: int | None) -> dict:
        return {
            "run_dir": self.run_dir,
            "checkpoint": os.path.join(self.run_dir, "checkpoint.pt") if self.run_dir else None,
            "global_step": global_step,
            "iteration": iteration,
            "mean_recent_return": float(np.mean(self.recent_returns)) if self.recent_returns else float("nan"),
            "history": self.history,
            "stopped_by": stopped_by,  # the signal that stopped the run early, or None
            "best_eval": self.best_eval,  # --eval-interval: the best evaluation's iteration and score, or None
        }


@torch.inference_mode()
def evaluate(checkpoint_path: str, episodes: int = 10, capture_video: bool = False, device: str = "auto",
             sim_device: str = "auto", env_kwargs: dict | None = None) -> dict:
    """Runs `episodes` deterministic episodes (`run_episodes`) of a checkpoint's policy, or of an exported policy.onnx
    run by onnxruntime alone, prints the result as JSON and returns it. The evaluation during training
    (--eval-interval) runs the same episodes: its eval/* logs of an iteration are this of that iteration's checkpoint.
    `env_kwargs` (--env-kwargs) go on top of the run's own: the same policy on a changed task (longer episodes, other
    terrain), as legged_gym's play.py edits its env config; the policy's observation and action must keep their sizes.
    """
    if episodes < 1:
        raise UsageError(f"--eval-episodes must be at least 1, got {episodes}")
    policy_device = pick_device(device, "--policy-device")
    exported = checkpoint_path.endswith(".onnx")
    if exported:
        policy = OnnxPolicy(checkpoint_path, "--eval-checkpoint")
        args = policy.args
    else:
        checkpoint = load_checkpoint(checkpoint_path, "--eval-checkpoint")
        args = args_from_checkpoint(checkpoint)
    args = dataclasses.replace(args, sim_device=sim_device)
    if env_kwargs:
        args = dataclasses.replace(args, env_kwargs={**(args.env_kwargs or {}), **env_kwargs})
    vec = evaluation_envs(args, episodes, policy_device, render=capture_video)
    if env_kwargs:
        changed = "--env-kwargs " + " ".join(f"{key} {','.join(map(str, value)) if isinstance(value, tuple) else value}"
                                             for key, value in env_kwargs.items())
        trained = ((policy.inputs[0].shape[1:], policy.outputs[0].shape[1]) if exported else
                   (checkpoint["obs_normalizer"]["mean"].shape, checkpoint["model"]["actor_logstd"].shape[-1]))
        try:
            check_policy_fits_task(vec, *trained, changed)
        except UsageError:
            vec.close()
            raise
        print(f"[eval] {args.env_id} with {changed} on top of the run's own options")
    if not exported:
        policy = deployed_policy(args, vec, checkpoint, policy_device)
    video = os.path.join(run_dir_of(checkpoint_path), "videos", "eval.mp4") if capture_video else None
    try:
        result = run_episodes(policy, vec, episodes, args.seed + EVAL_SEED_OFFSET, video)
    finally:
        vec.close()
    print(json.dumps(result))
    return result


def check_policy_fits_task(vec, obs_shape, action_size: int, changed: str) -> None:
    """A UsageError unless the task as `changed` (the --env-kwargs typed) gives the policy an observation of the shape
    it was trained on and takes an action of its size (`obs_shape`, `action_size`: the checkpoint's or the exported
    policy's). The critic's observation may change (randomised dynamics it alone reads): the critic never runs here,
    and `deployed_policy` builds it as trained. So may the action's bounds (a tighter limit): the policy keeps the
    bounds it was trained with, as a deployed policy does, and the task applies its own."""
    here = tuple(vec.single_observation_space.shape)
    if here != tuple(obs_shape):
        raise UsageError(f"{changed}: the task's observation has size {here}, the policy's {tuple(obs_shape)}; "
                         "leave out the options that change what the policy observes")
    acts = vec.single_action_space.shape[0]
    if acts != action_size:
        raise UsageError(f"{changed}: the task's action has size {acts}, the policy's {action_size}; "
                         "leave out the options that change what the policy controls")


EVAL_SEED_OFFSET = 10_000  # evaluation envs' seeds: args.seed + this, a seed the training envs never take
# run_episodes' results as the evaluation during training logs them (the task's episode metrics as eval/<name>)
EVAL_NAMES = {"mean_return": "eval/return", "std_return": "eval/return_std", "mean_length": "eval/episode_length",
              "success_rate": "eval/success"}


def evaluation_envs(args: Args, episodes: int, device: torch.device, render: bool = False):
    """The envs evaluation runs on: one per episode up to the training's count (at least 16), first episodes not
    staggered."""
    num_envs = min(episodes, max(16, args.num_envs))
    return make_env(args, num_envs, args.seed + EVAL_SEED_OFFSET, device, render=render, stagger_episodes=False)


@torch.inference_mode()
def run_episodes(policy, vec, episodes: int, seed: int, video: str | None = None) -> dict:
    """`episodes` episodes of `policy` (DeployedPolicy, or OnnxPolicy) on `vec`, reset with `seed` (the same
    episodes every time): the policy as deployed, its memory carried from step to step and zeroed where an episode
    ends, as a controller does. The episodes are spread evenly over the envs and each env's first ones count, so
    short episodes are not over-counted. Returns the mean return, its std, the mean length, the success rate (where
    the task reports success) and the task's episode metrics (`video`: env 0's first episode written there)."""
    num_envs = vec.num_envs
    quota = [episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)]  # sums to `episodes`
    obs, _ = vec.reset(seed=seed)
    memory = policy.initial_memory(num_envs, obs.device)
    returns, successes = [[] for _ in range(num_envs)], [[] for _ in range(num_envs)]
    lengths, task_metrics = [], {}  # of the counted episodes; the task's own metrics (info["episode_metrics"])
    recorder = EpisodeRecorder()
    if video is not None:
        recorder.start(vec)
    while any(len(r) < q for r, q in zip(returns, quota)):
        action, *memory = policy(obs, *memory)
        obs, _, terminated, truncated, info = vec.step(action)
        done = terminated | truncated
        memory = [m.masked_fill(done.view(-1, *[1] * (m.dim() - 1)), 0) for m in memory]  # a new episode: none yet
        if video is not None:
            recorder.step(vec, done, video)
        episode = info["episode"]
        for i in episode["mask"].nonzero().flatten().tolist():
            if len(returns[i]) < quota[i]:
                returns[i].append(float(episode["r"][i]))
                lengths.append(int(episode["l"][i]))
                if "success" in info:
                    successes[i].append(bool(info["success"][i]))
                for name, value in info.get("episode_metrics", {}).items():
                    task_metrics.setdefault(name, []).append(float(value[i]))
    flat_returns = [r for env_returns in returns for r in env_returns]
    result = {"episodes": len(flat_returns), "mean_return": float(np.mean(flat_returns)),
              "std_return": float(np.std(flat_returns)), "mean_length": float(np.mean(lengths)),
              **{name: float(np.nanmean(values)) for name, values in task_metrics.items()
                 if not np.isnan(values).all()}}  # NaN: a metric that does not apply to that episode
    if any(successes):
        result["success_rate"] = float(np.mean([s for env_s in successes for s in env_s]))
    if video is not None:
        result["video"] = video
    return result


def deployed_policy(args: Args, vec, checkpoint: dict, device: torch.device) -> DeployedPolicy:
    """The checkpoint's policy as a robot runs it. The critic is built, to load the model, but never runs: it is built
    for the critic observation it was trained on, which a task changed by --env-kwargs may no longer give."""
    trained_critic = checkpoint.get("critic_obs_normalizer")  # None: the critic read the policy's observation
    agent, obs_norm, _ = build_agent(dataclasses.replace(args, privileged_critic=trained_critic is not None), vec,
                                     device, None if trained_critic is None else tuple(trained_critic["mean"].shape))
    agent.load_state_dict(checkpoint["model"])
    obs_norm.load_state_dict(checkpoint["obs_normalizer"])
    return DeployedPolicy(agent, obs_norm).eval()


class OnnxPolicy:
    """An exported policy.onnx run by onnxruntime alone, called as `DeployedPolicy` is (torch tensors in and out):
    evaluating it runs no network code of this script."""

    def __init__(self, path: str, flag: str):
        import onnxruntime

        if not os.path.isfile(path):
            raise UsageError(f"{flag} {path}: no such file")
        try:
            self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime's own exception types: a file that is not an ONNX model
            raise UsageError(f"{flag} {path} is not an ONNX model ({str(error).splitlines()[0][:200]})") from None
        metadata = self.session.get_modelmeta().custom_metadata_map
        if metadata.get("script") != CHECKPOINT_KIND:
            raise UsageError(f"{flag} {path} was not exported by {CHECKPOINT_KIND}.py (script: "
                             f"{metadata.get('script', 'none recorded')}); evaluate it with that script")
        self.args = args_from_checkpoint({"args": json.loads(metadata["args"])})
        self.inputs, self.outputs = self.session.get_inputs(), self.session.get_outputs()

    def initial_memory(self, batch: int, device: torch.device) -> list[torch.Tensor]:
        return [torch.zeros(batch, *i.shape[1:], dtype=torch.bool if i.type == "tensor(bool)" else torch.float32,
                            device=device) for i in self.inputs[1:]]

    def __call__(self, obs: torch.Tensor, *memory: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feeds = {i.name: x.cpu().numpy() for i, x in zip(self.inputs, (obs, *memory))}
        return tuple(torch.from_numpy(out).to(obs.device) for out in self.session.run(None, feeds))


def export_policy(checkpoint_path: str) -> tuple[str, str]:
    """Writes policy.onnx and policy.pt (TorchScript) beside the checkpoint: `DeployedPolicy`, with a dynamic batch
    size, its memory as explicit inputs and outputs (zeros at an episode's start), and in the ONNX metadata what a
    controller needs (the task, sizes, action bounds, control period, the memory's layout, the script, the
    iteration, the run's flags). Each file appears whole or not at all. Returns their paths."""
    import onnx

    checkpoint = load_checkpoint(checkpoint_path, "--export-checkpoint")
    args = dataclasses.replace(args_from_checkpoint(checkpoint), sim_device="cpu")
    cpu = torch.device("cpu")
    vec = make_env(args, 1, args.seed, cpu, stagger_episodes=False)  # the spaces, names and control period
    policy = deployed_policy(args, vec, checkpoint, cpu)
    obs_space, action_space = vec.single_observation_space, vec.single_action_space
    control_dt, names = getattr(vec, "control_dt", None), getattr(vec, "observation_names", None)
    vec.close()
    example = (torch.zeros(2, *obs_space.shape), *policy.initial_memory(2, cpu))
    inputs, outputs = ["obs", *policy.memory_names], ["action", *(f"next_{name}" for name in policy.memory_names)]
    metadata = {
        "script": CHECKPOINT_KIND, "env_id": args.env_id, "iteration": checkpoint["iteration"],
        "global_step": checkpoint["global_step"], "observation_size": obs_space.shape[0],
        "action_size": action_space.shape[0], "action_low": action_space.low.tolist(),
        "action_high": action_space.high.tolist(), "control_dt": control_dt, "observation_names": names,
        "inputs": {name: [("batch", *x.shape[1:]), str(x.dtype)] for name, x in zip(inputs, example)},
        "memory_at_episode_start": "zeros (False for booleans)", "args": checkpoint["args"],
    }
    folder = os.path.dirname(os.path.abspath(checkpoint_path))
    onnx_path, torchscript_path = os.path.join(folder, "policy.onnx"), os.path.join(folder, "policy.pt")
    batch = torch.export.Dim("batch")
    program = torch.onnx.export(policy, example, input_names=inputs, output_names=outputs, dynamo=True,
                                dynamic_shapes=[{0: batch}] * len(example), verbose=False)
    model = program.model_proto
    onnx.helper.set_model_props(model, {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()})
    try:  # both written before either replaces its file: an export stopped halfway leaves the last pair whole
        onnx.save(model, onnx_path + ".tmp")
        check_inputs = [(torch.ones(3, *obs_space.shape), *policy.initial_memory(3, cpu))]
        torch.jit.trace(policy, example, check_inputs=check_inputs).save(torchscript_path + ".tmp")
        os.replace(onnx_path + ".tmp", onnx_path)
        os.replace(torchscript_path + ".tmp", torchscript_path)
    finally:
        for unfinished in (onnx_path + ".tmp", torchscript_path + ".tmp"):
            if os.path.exists(unfinished):
                os.remove(unfinished)
    print(f"exported: {onnx_path}\n          {torchscript_path}")
    return onnx_path, torchscript_path


def make_env(args: Args, num_envs: int, seed: int, device: torch.device, render: bool = False, **overrides):
    own = [key for key in ("num_envs", "seed", "device", "sim_device", "vectorization_mode", "render_mode")
           if key in (args.env_kwargs or {})]
    if own:
        raise UsageError(f"--env-kwargs {own[0]}: set by the script's own flags (--num-envs, --seed, --cuda, "
                         "--policy-device, --sim-device, --vectorization-mode, --capture-video); give it there")
    try:
        return envs.make(args.env_id, num_envs=num_envs, seed=seed, device=device, sim_device=args.sim_device,
                         vectorization_mode=args.vectorization_mode, render_mode="rgb_array" if render else None,
                         **{**(args.env_kwargs or {}), **overrides})
    except ValueError as error:  # an unknown id, or an option the task does not have or rejects
        flag = "--env-kwargs" if args.env_kwargs and not isinstance(error, envs.UnknownTaskError) else "--env-id"
        raise UsageError(f"{flag}: {error}") from None


def parse_args(argv: list[str] | None = None) -> Args:
    """The flags on top of the chosen task's settings, so that `--env-id X --help` shows what will run."""
    argv = sys.argv[1:] if argv is None else argv
    env_id = Args.env_id
    for i, flag in enumerate(argv):
        if flag == "--env-id" and i + 1 < len(argv):
            env_id = argv[i + 1]
        elif flag.startswith("--env-id="):
            env_id = flag.split("=", 1)[1]
    # From a checkpoint (resume, evaluate, export) the flags are its own: parsed against the script's defaults, and
    # those typed (flags_typed) replace the checkpoint's where they may.
    from_checkpoint = any(flag.split("=", 1)[0] in ("--resume", "--eval-checkpoint", "--export-checkpoint")
                          for flag in argv)
    args = tyro.cli(Args, args=argv, default=Args() if from_checkpoint else task_args(env_id))
    # Several numbers are one word, "low,high" (a range) or "x,y,z" (a point): as several words, tyro cannot tell them
    # from a number and the next key.
    for key, value in (args.env_kwargs or {}).items():
        if isinstance(value, str) and "," in value:
            try:
                args.env_kwargs[key] = tuple(float(number) for number in value.split(","))
            except ValueError:  # not numbers: left for the task to take or refuse
                pass
    return args


def refuse_unused_flags(args: Args, typed_flags: set[str], mode: str, used: tuple[str, ...]) -> None:
    """Evaluating or exporting a checkpoint reads `used` of the command line and the rest from the checkpoint; any
    other flag typed would do nothing, so it is refused rather than ignored."""
    unused = list(flags_given(args, used, typed_flags))
    if unused:
        raise UsageError(f"--{unused[0].replace('_', '-')} does nothing with {mode} (the checkpoint holds the run's "
                         "flags); leave it out")


def print_run_end(summary: dict) -> None:
    """A run's last lines: where it is, how it ended, and the commands to watch, evaluate and (if stopped) resume it."""
    if summary["run_dir"] is None:  # torchrun: process 0 speaks for all
        return
    history, script = summary["history"], LAUNCHED_AS
    success = next((h["charts/success_rate"] for h in reversed(history) if "charts/success_rate" in h), None)
    ended = f"stopped by {signal.Signals(summary['stopped_by']).name}" if summary["stopped_by"] else "finished"
    lines = [f"\n{ended} at iteration {summary['iteration']} ({summary['global_step']:,} steps): {summary['run_dir']}",
             "training episodes: " + ("none ended (the run was shorter than an episode)"
                                      if math.isnan(summary["mean_recent_return"]) else
                                      f"mean return of the last 100 {summary['mean_recent_return']:.2f}")
             + (f", success rate of the last iteration {success:.1%}" if success is not None else ""),
             "watch:    tensorboard --logdir runs",
             f"evaluate: python {script} --eval-checkpoint {summary['checkpoint']} --eval-episodes 100"]
    if summary["best_eval"] is not None:  # evaluated while training (--eval-interval)
        *success, mean_return = summary["best_eval"]["score"]
        lines.append(f"best:     {os.path.join(summary['run_dir'], 'checkpoint_best.pt')} (iteration "
                     f"{summary['best_eval']['iteration']}: " + (f"eval success {success[0]:.1%}, " if success else "")
                     + f"eval return {mean_return:.2f})")
    if summary["stopped_by"]:  # under torchrun, with as many processes (the checkpoint holds each one's envs)
        world, per_node = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        launcher = f"python {script}" if world == 1 else (
            f"torchrun --standalone --nproc-per-node {world} {script}" if world == per_node else
            f"torchrun --nnodes {world // per_node} --nproc-per-node {per_node} <rendezvous flags as before> {script}")
        lines.append(f"resume:   {launcher} --resume {summary['run_dir']}")
    print("\n".join(lines), flush=True)


def cli(argv: list[str] | None = None) -> None:
    """Trains, evaluates --eval-checkpoint, or exports --export-checkpoint. Bad input ends with one line naming the
    flag and the fix (exit status 2); a failing env, training that diverged, or a checkpoint that could not be
    written, with one line and exit status 1; a run stopped by SIGINT or SIGTERM, once its checkpoint is saved, with
    128 + the signal's number, as a shell reports a signalled process; Ctrl-C that cannot wait for a checkpoint (while
    evaluating or exporting, before the first iteration, a second one), with one line and 130."""
    argv = sys.argv[1:] if argv is None else argv
    args, typed_flags = parse_args(argv), flags_typed(argv)
    try:
        if args.eval_checkpoint:
            refuse_unused_flags(args, typed_flags, "--eval-checkpoint", (
                "eval_checkpoint", "eval_episodes", "capture_video", "cuda", "policy_device", "sim_device",
                "progress_bar", "env_kwargs"))
            devices = ("cuda", "cuda") if args.cuda else (args.policy_device, args.sim_device)
            evaluate(args.eval_checkpoint, args.eval_episodes, args.capture_video, *devices, args.env_kwargs)
        elif args.export_checkpoint:
            refuse_unused_flags(args, typed_flags, "--export-checkpoint", ("export_checkpoint", "progress_bar"))
            export_policy(args.export_checkpoint)
        else:
            summary = train(args, typed_flags=typed_flags)
            print_run_end(summary)
            if summary["stopped_by"]:
                raise SystemExit(128 + summary["stopped_by"])
    except (UsageError, EnvStepError, TrainingDiverged, CheckpointNotWritten) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2 if isinstance(error, UsageError) else 1) from None
    except KeyboardInterrupt:  # a training run saves and stops on its own (StopSignal); this is what it could not
        print("interrupted (SIGINT): " + (
            "the evaluation stopped before its end, without a result" if args.eval_checkpoint else
            "the export stopped before its end; policy.onnx and policy.pt are as they were" if args.export_checkpoint
            else "training stopped at once, without saving (a second Ctrl-C, or one before the first iteration); "
                 "a run that saved a checkpoint goes on with --resume"), file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
    except RuntimeError as error:  # under torchrun, a collective that failed: another process died or hangs
        collective = isinstance(error, dist.DistError) or "gloo" in str(error)
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not collective:
            raise
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        print(f"error: process {os.environ.get('RANK')} lost the others ({reason}): one of them failed (its log says "
              f"why) or did not answer within --dist-timeout-s {args.dist_timeout_s}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    cli()
