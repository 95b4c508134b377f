#!/bin/bash
#SBATCH --job-name=llama-7b-zero3
#SBATCH --partition=gpu
#SBATCH --account=proj-42
#SBATCH --qos=high
#SBATCH --time=1-00:00:00
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --mem=500G
#SBATCH --output=/scratch/outputs/llama-7b-zero3/20260101-000000/logs/slurm-%j.out
#SBATCH --error=/scratch/outputs/llama-7b-zero3/20260101-000000/logs/slurm-%j.err
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --exclusive
#SBATCH "--constraint=a100&ib"

# Written by ftlaunch (`ftl submit`). Not `set -e`: the end decides on the exit code.
set -uo pipefail
export FTL_RUN_DIR=/scratch/outputs/llama-7b-zero3/20260101-000000
if [ -e "$FTL_RUN_DIR"/cancel.requested ]; then
    echo "ftl: cancelled by \`ftl cancel\` before this start; not training"
    exit 75
fi
rm -f "$FTL_RUN_DIR"/preempt.requested "$FTL_RUN_DIR"/preempted
rm -rf "$FTL_RUN_DIR"/hang  # an earlier start's hang (a requeue by hand)
rm -rf "$FTL_RUN_DIR"/startup  # who starts is recorded afresh at each start
[ -e "$FTL_RUN_DIR"/cancel.requested ] && touch "$FTL_RUN_DIR"/preempt.requested

# USR1 (--signal=B:USR1@grace, `scancel -b -s USR1`), TERM (a preemption, `scancel
# --full` or `--batch`) and INT: ask the ranks to save a checkpoint at the next step
# boundary and stop; the end of this script requeues (not after `ftl cancel`).
ftl_preempt() {
    echo "ftl: $1 at $(date +%FT%T): checkpointing at the next step, then stopping"
    touch "$FTL_RUN_DIR"/preempt.requested
}
trap 'ftl_preempt USR1' USR1
trap 'ftl_preempt TERM' TERM
trap 'ftl_preempt INT' INT

# cluster.setup (run as written)
module load cuda/12.4
source /opt/venv/bin/activate

export PYTHONUNBUFFERED=1
FTL_HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"
export FTL_HEAD_NODE
echo "ftl: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST, head node $FTL_HEAD_NODE, run dir $FTL_RUN_DIR"

# One task per node: it starts this node's ranks (node rank = SLURM_NODEID).
# srun in a session of its own: a TERM to this script's process group (`scancel
# --full`) would make srun kill the step ("forcing job termination"), ignored or not.
setsid srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=32 \
    bash -c '
export FTL_NODE_RANK="$SLURM_NODEID"
ftl_stop() {
    echo "ftl: node $FTL_NODE_RANK: $1: checkpointing at the next step, then stopping"
    touch "$FTL_RUN_DIR"/preempt.requested
}
trap "ftl_stop TERM" TERM
trap "ftl_stop INT" INT
mkdir -p "$FTL_RUN_DIR"/startup && printf '"'"'{"node": %s, "host": "%s", "time": %s}\n'"'"' "$FTL_NODE_RANK" "$(hostname)" "$(date +%s)" > "$FTL_RUN_DIR"/startup/node-"$FTL_NODE_RANK".json
(trap "" TERM INT; exec setsid deepspeed --num_gpus 8 --master_port 29500 --no_local_rank --enable_each_rank_log "${FTL_RUN_DIR}"/logs --module launcher.rank.worker "${FTL_RUN_DIR}") &
launcher=$!
# wait returns early (status > 128) when a trap ran; then keep waiting.
while :; do
    rc=0; wait "$launcher" || rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$launcher" 2>/dev/null; then continue; fi
    break
done
exit "$rc"
' &
step=$!
# wait returns early (status > 128) when a trap ran; then keep waiting.
while :; do
    rc=0; wait "$step" || rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$step" 2>/dev/null; then continue; fi
    break
done

if [ -e "$FTL_RUN_DIR"/result.json ] && [ ! -e "$FTL_RUN_DIR"/preempted ]; then
    echo "ftl: run finished (step exit code $rc)"
    [ "$rc" -eq 0 ] || echo "ftl: the run completed; a non-zero exit at shutdown"
    exit 0
fi
if compgen -G "$FTL_RUN_DIR/hang/rank-*.json" > /dev/null; then
    echo "ftl: hung: a rank made no progress within train.hang_timeout_s; stacks in $FTL_RUN_DIR/hang (\`ftl status $FTL_RUN_DIR\` says where each rank was). Not requeued; the same \`ftl submit\` command resumes from the latest complete checkpoint. Exit status 76"
    exit 76
fi
if [ -e "$FTL_RUN_DIR"/cancel.requested ]; then
    stop_step=$(sed -n 's/.*"step": *\([0-9]*\).*/\1/p' "$FTL_RUN_DIR"/preempted 2>/dev/null)
    if [ -n "$stop_step" ] && [ -e "$FTL_RUN_DIR"/checkpoints/checkpoint-"$stop_step"/COMPLETE ]; then
        echo "ftl: cancelled by \`ftl cancel\` after a complete checkpoint (step $stop_step); not requeueing. Exit status 75: stopped, resumable"
        exit 75
    fi
    echo "ftl: cancelled by \`ftl cancel\` without a new complete checkpoint; not requeueing"
elif [ -e "$FTL_RUN_DIR"/preempt.requested ]; then
    restarts=${SLURM_RESTART_COUNT:-0}
    if [ "$restarts" -lt 5 ]; then
        echo "ftl: requeueing (restart $((restarts + 1)) of 5); the rerun resumes from the latest complete checkpoint (step exit code $rc)"
        scontrol requeue "$SLURM_JOB_ID" && exit 0
        echo "ftl: scontrol requeue failed"
    else
        echo "ftl: not requeueing: cluster.slurm.max_restarts=5 reached"
    fi
fi
[ "$rc" -eq 0 ] && rc=1  # the ranks stopped early: the run is not done
python -m launcher.rank.startup "$FTL_RUN_DIR"  # the nodes/ranks that never came
echo "ftl: the run did not finish (exit code $rc); rank logs: $FTL_RUN_DIR/logs"
exit "$rc"
