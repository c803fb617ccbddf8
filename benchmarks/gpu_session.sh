#!/bin/bash
# Issue 51's GPU checks as one command, cheapest first; benchmarks/results/gpu.md says what each has measured so far.
#
#   bash benchmarks/gpu_session.sh [STEP ...]   steps: sim syncs go2 static memory gru_graphs gym tests compile
#                                               cudagraphs split reach pick torchrun resume profile busy contacts
#                                               (default: all)
#
# Run it from the repository root on a CUDA machine with the project's packages importable. Each step is stamped
# with the clock in $OUT/log.txt (default gpu_out/), so wall times can be read against the runs' TensorBoard events,
# which end up in $OUT/runs.tgz (no checkpoints). Each step has a time limit; a step that fails does not stop the
# next. On a fresh machine the first Genesis build compiles the kernels (about 2 minutes on an H200), so put `sim`
# first. SMALL=1 runs every step at toy sizes on the CPU: a check of the commands, not a measurement.
set -o pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if [ "${SMALL:-0}" = 1 ]; then
    ENVS=8 DEVICE="--policy-device cpu --sim-device cpu" SIM_DEVICE=cpu ITERATIONS=2 EPISODES=2 SCALE=1
else
    ENVS=4096 DEVICE="--cuda" SIM_DEVICE=gpu ITERATIONS=100 EPISODES=200 SCALE=0
fi
QUIET="--no-progress-bar"

stamp() { echo "== $(date +%s.%N) $*" | tee -a "$LOG"; }
# run LIMIT_S COMMAND...: the command's output to the log (the compiler's deprecation chatter left out)
run() {
    local limit=$1
    shift
    echo "\$ $*" >>"$LOG"
    timeout "$limit" "$@" 2>&1 | grep -v "DeprecationWarning\|isinstance(stmt.value\|settotalmass" | tee -a "$LOG"
}
steps_of() { echo $(($1 * 24 * ENVS)); }  # total steps of $1 iterations of 24 steps

step_sim() {  # item 1: build and step each robot task on gs.gpu (the first build compiles the kernels)
    local sizes=${SIM_SIZES:-1024 4096}
    [ $SCALE = 1 ] && sizes="4 8"
    run 400 $PY benchmarks/gpu_checks.py sim --sim-device $SIM_DEVICE --num-envs $sizes \
        --env-ids Go2Walk-v0 FrankaReach-v0 FrankaPickCube-v0 Go2Rough-v0
}

step_contacts() {  # items 1 and 2: the stacking task stepped with its contacts read trimmed (one wait per read)
    # and padded (none, but every env's 750 slots gathered: 2-3x slower on the CPU); docs/tasks.md
    local sizes=${SIM_SIZES:-1024 4096}
    [ $SCALE = 1 ] && sizes="4"
    for padded in --no-padded-contacts --padded-contacts; do
        run 300 $PY benchmarks/gpu_checks.py sim --sim-device $SIM_DEVICE --num-envs $sizes \
            --env-ids FrankaStackCube-v0 $padded
    done
}

step_syncs() {  # item 2: host syncs per rollout step, by line, in each script (needs CUDA)
    [ $SCALE = 1 ] && { echo "syncs: needs CUDA, skipped" | tee -a "$LOG"; return; }
    run 200 $PY benchmarks/gpu_checks.py syncs --env-id Go2Walk-v0 --num-envs $ENVS
}

step_go2() {  # item 3: Genesis's example settings, 100 iterations, evaluated every 10 (time to the flat bar);
    # the limit leaves room for a fresh machine's kernel compile (about 2 minutes). GO2_FLAGS: e.g. "--compile
    # --compile-mode reduce-overhead"
    run 420 $PY ppo_continuous.py --env-id Go2Walk-v0 $DEVICE --num-envs $ENVS --hidden-sizes 512 256 128 \
        --total-timesteps $(steps_of $ITERATIONS) --eval-interval $((ITERATIONS / 10 > 0 ? ITERATIONS / 10 : 1)) \
        --eval-episodes $EPISODES --exp-name gpu_genesis_example ${GO2_FLAGS:-} $QUIET
}

step_static() {  # item 3 in Genesis's performance mode (GS_ENABLE_NDARRAY=0, what gs.init(performance_mode=True)
    # sets; Genesis's own go2_train.py runs so): kernels specialised to the scene, compiled per scene (minutes on a
    # fresh cache); on 2 CPU cores the scene stepped ~30% faster, on an H200 no faster. The same run as `go2`.
    GS_ENABLE_NDARRAY=0 run 540 $PY ppo_continuous.py --env-id Go2Walk-v0 $DEVICE --num-envs $ENVS \
        --hidden-sizes 512 256 128 --total-timesteps $(steps_of $ITERATIONS) \
        --eval-interval $((ITERATIONS / 10 > 0 ? ITERATIONS / 10 : 1)) --eval-episodes $EPISODES \
        --exp-name gpu_genesis_static $QUIET
}

step_memory() {  # item 2: the recurrent and transformer scripts on CUDA, their checkpoints evaluated on both devices;
    # MEMORY_FLAGS: e.g. "--compile --compile-mode reduce-overhead" (their carried state under CUDA graphs)
    for script in ppo_recurrent ppo_transformer; do
        run 200 $PY $script.py --env-id Go2WalkNoVel-v0 $DEVICE --num-envs $ENVS \
            --total-timesteps $(steps_of $((ITERATIONS / 10 > 2 ? ITERATIONS / 10 : 2))) --eval-interval 0 \
            --exp-name gpu_$script ${MEMORY_FLAGS:-} $QUIET
        local checkpoint
        checkpoint=$(ls -td runs/Go2WalkNoVel-v0__gpu_${script}__*/ | head -1)checkpoint.pt
        for policy in cuda cpu; do
            [ $SCALE = 1 ] && policy=cpu
            run 120 $PY $script.py --eval-checkpoint "$checkpoint" --eval-episodes $EPISODES --policy-device $policy \
                --sim-device $([ $SCALE = 1 ] && echo cpu || echo cuda)
        done
    done
}

step_gru_graphs() {  # items 2 and 6: the GRU's update under CUDA graphs (sixth GPU session: a new graph recorded for
    # each shape of its segmented sequences, which depend on where episodes start) against eager and against graphs
    # kept to its static-shape calls (inductor's cudagraph_skip_dynamic_graphs); the same 10 iterations each, one
    # sitting (update_s in the events); the graphed runs print torch's perf hints (a graph skipped, and why)
    local n=$([ $SCALE = 1 ] && echo 2 || echo 10) flags prelude logs
    for mode in eager graphs graphs_static; do
        flags="--compile --compile-mode reduce-overhead" prelude="pass" logs="perf_hints"
        [ $mode = eager ] && flags="" logs=""
        [ $mode = graphs_static ] && prelude="import torch._inductor.config as c
c.triton.cudagraph_skip_dynamic_graphs = True"
        TORCH_LOGS=$logs run 200 $PY -c "import sys
$prelude
import ppo_recurrent
sys.argv[0] = 'ppo_recurrent.py'
ppo_recurrent.cli()" \
            --env-id Go2WalkNoVel-v0 $DEVICE --num-envs $ENVS --total-timesteps $(steps_of $n) --eval-interval 0 \
            --exp-name gpu_gru_$mode $flags $QUIET
    done
}

step_gym() {  # item 2 on a Gymnasium task: each script trains on CUDA (first-minibatch ratio in the events), its
    # checkpoint evaluated with the policy on the GPU and on the CPU (the same numbers expected)
    local task=${GYM_TASK:-HalfCheetah-v5}
    for script in ppo_continuous ppo_recurrent ppo_transformer; do
        run 200 $PY $script.py --env-id $task $DEVICE --num-envs 8 --num-steps 256 --total-timesteps 20480 \
            --eval-interval 0 --exp-name gpu_gym_$script $QUIET
        local checkpoint
        checkpoint=$(ls -td runs/${task}__gpu_gym_${script}__*/ | head -1)checkpoint.pt
        for policy in cuda cpu; do
            [ $SCALE = 1 ] && policy=cpu
            run 120 $PY $script.py --eval-checkpoint "$checkpoint" --eval-episodes 4 --policy-device $policy
        done
    done
}

step_tests() {  # item 2: the test suite on a CUDA machine (its recorded numbers pin the CPU; the rest sees a GPU)
    run ${TESTS_LIMIT:-300} $PY -m pytest -q -p no:cacheprovider -rf ${TESTS:-tests/test_invariants.py}
}

step_compile() {  # item 6: --compile against eager, the same 20 iterations (SPS in the events)
    for compiled in --no-compile --compile; do
        run 300 $PY ppo_continuous.py --env-id Go2Walk-v0 $DEVICE --num-envs $ENVS --hidden-sizes 512 256 128 \
            --total-timesteps $(steps_of $((ITERATIONS / 5 > 2 ? ITERATIONS / 5 : 2))) --eval-interval 0 $compiled \
            --exp-name gpu_${compiled#--} $QUIET
    done
}

step_cudagraphs() {  # item 6: --compile with CUDA graphs (--compile-mode reduce-overhead, LeanRL's lever for a
    # host-bound loop); the same 20 iterations as `compile` (on the CPU: no graphs)
    run 300 $PY ppo_continuous.py --env-id Go2Walk-v0 $DEVICE --num-envs $ENVS --hidden-sizes 512 256 128 \
        --total-timesteps $(steps_of $((ITERATIONS / 5 > 2 ? ITERATIONS / 5 : 2))) --eval-interval 0 --compile \
        --compile-mode reduce-overhead --exp-name gpu_cudagraphs $QUIET
}

step_split() {  # item 6: the device split: FrankaReach-v0 trained with the policy and the simulator on each device
    # (both on the GPU, the policy on the CPU, the simulator on the CPU), evaluated at the end (same within noise).
    # At 40 iterations (seventh GPU session) the reach curve is steep and seeds spread 0-86%: SPLIT_ITERATIONS=150
    # ends past 95% (1.8M steps), SPLIT_SEEDS="1 2 3" gives each placement its spread
    local n=$([ $SCALE = 1 ] && echo 8 || echo 512) seed
    local iterations=$([ $SCALE = 1 ] && echo 2 || echo ${SPLIT_ITERATIONS:-40})
    for seed in ${SPLIT_SEEDS:-1}; do
        for split in "cuda cuda" "cpu cuda" "cuda cpu"; do
            set -- $split
            [ $SCALE = 1 ] && set -- cpu cpu
            run 300 $PY ppo_continuous.py --env-id FrankaReach-v0 --policy-device $1 --sim-device $2 --num-envs $n \
                --total-timesteps $((n * 24 * iterations)) --eval-interval $iterations --eval-episodes $EPISODES \
                --seed $seed --exp-name gpu_split_$1_$2 $QUIET
        done
    done
}

step_reach() {  # item 4: FrankaReach-v0 at 4096 envs with each script's preset, evaluated every 10 iterations (the
    # wall time to 95% success); ppo_continuous.py's ran on the first GPU session (97% at iteration 80), so by
    # default the other two (REACH_SCRIPTS)
    for script in ${REACH_SCRIPTS:-ppo_recurrent ppo_transformer}; do
        run ${REACH_LIMIT:-240} $PY $script.py --env-id FrankaReach-v0 $DEVICE --num-envs $ENVS \
            $([ $SCALE = 1 ] && echo "--total-timesteps 384") --eval-interval 10 --eval-episodes $EPISODES \
            --exp-name gpu_reach_$script $QUIET
    done
}

step_pick() {  # item 5: picking at 4096 envs with ManiSkill3's short rollouts (ppo_fast: 4096 envs x 8 steps);
    # 59.5% at 5M steps and rising on the second GPU session; on the third (--compile) 81% at 7.86M, then a collapse
    # (KL 1.5-13 per update): PICK_FLAGS by default also stops the epochs at the first minibatch over --target-kl,
    # as ManiSkill3's ppo_fast does, and adds CUDA graphs (the update halved on the Go2, fifth GPU session); so on
    # the sixth: 93.5% at 2.95M, no collapse to 10M. 10M steps by default (PICK_STEPS): 3.2 min of training and
    # evaluations after a fresh machine's 3.5 min start.
    run ${PICK_LIMIT:-540} $PY ppo_continuous.py --env-id FrankaPickCube-v0 $DEVICE --num-envs $ENVS --num-steps 8 \
        --total-timesteps $([ $SCALE = 1 ] && echo 128 || echo ${PICK_STEPS:-10000000}) --eval-interval 10 \
        --eval-episodes $EPISODES --exp-name gpu_pick_short \
        ${PICK_FLAGS---compile --compile-mode reduce-overhead --target-kl-per-minibatch} $QUIET
}

step_torchrun() {  # item 7: two processes sharing one GPU (gloo), half the envs each
    run 300 torchrun --standalone --nproc-per-node 2 ppo_continuous.py --env-id Go2Walk-v0 $DEVICE \
        --num-envs $((ENVS / 2)) --total-timesteps $(steps_of $((ITERATIONS / 5 > 2 ? ITERATIONS / 5 : 2))) \
        --eval-interval 0 --exp-name gpu_torchrun $QUIET
}

step_resume() {  # item 7's neighbour: a GPU run's copy resumed on the GPU from its middle checkpoint, against the run
    # itself (`gpu_checks.py same`: every logged value equal where the simulation repeats itself), then on the CPU
    # (the envs' state saved on the GPU loaded there; the flags of the command line pick the devices); the events
    # continue with no step twice
    local n=$([ $SCALE = 1 ] && echo 8 || echo 256) dir copy
    run 200 $PY ppo_continuous.py --env-id Go2Walk-v0 $DEVICE --num-envs $n --total-timesteps $((n * 24 * 8)) \
        --checkpoint-interval 4 --eval-interval 0 --exp-name gpu_resume $QUIET
    dir=$(ls -td runs/Go2Walk-v0__gpu_resume__*/ | head -1)
    copy=${dir%/}__resumed
    rm -rf "$copy" && cp -r "$dir" "$copy"
    run 200 $PY ppo_continuous.py --resume "$copy/checkpoint_000004.pt" $DEVICE $QUIET
    run 60 $PY benchmarks/gpu_checks.py same --run-dirs "$dir" "$copy"
    run 300 $PY ppo_continuous.py --resume "$copy" --policy-device cpu --sim-device cpu \
        --total-timesteps $((n * 24 * 10)) $QUIET
}

step_profile() {  # items 2 and 3: where a Go2 iteration's time goes (cProfile, 10 iterations; the start included)
    run 200 $PY -c "import cProfile, sys; import ppo_continuous; sys.argv[0] = 'ppo_continuous.py'
cProfile.run('ppo_continuous.cli()', sys.argv.pop(1))" "$OUT/go2.prof" --env-id Go2Walk-v0 $DEVICE \
        --num-envs $ENVS --hidden-sizes 512 256 128 --total-timesteps $(steps_of 10) --eval-interval 0 \
        --exp-name gpu_profile $QUIET
    $PY -c "import pstats, sys; s = pstats.Stats(sys.argv[1], stream=sys.stdout); s.sort_stats('tottime').print_stats(50)
s.sort_stats('cumulative').print_stats(80)" "$OUT/go2.prof" >"$OUT/go2_profile.txt" 2>&1
}

step_busy() {  # items 2, 3 and 6: the GPU's share of a Go2 iteration (near 100%: the GPU limits, else the host)
    local small=""
    [ $SCALE = 1 ] && small="--num-steps 4 --update-epochs 1 --num-minibatches 1 --hidden-sizes 8"
    run 200 $PY benchmarks/gpu_checks.py busy --env-id Go2Walk-v0 --num-envs $ENVS $small \
        --trace "$OUT/go2_trace.json" ${BUSY_FLAGS:-}  # BUSY_FLAGS: e.g. --compile
    gzip -f "$OUT/go2_trace.json"
}

stamp start
if [ $SCALE = 0 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
fi
$PY -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)" 2>&1 | tee -a "$LOG"
for step in ${@:-sim syncs go2 static memory gru_graphs gym tests compile cudagraphs split reach pick torchrun resume \
    profile busy contacts}; do
    stamp "$step"
    "step_$step" || echo "$step: exit $?" | tee -a "$LOG"
    tar czf "$OUT/runs.tgz" --exclude='*.pt' runs/*__gpu_* runs/*__syncs__* 2>/dev/null
done
stamp end
