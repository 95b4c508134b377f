#!/bin/bash
#SBATCH --job-name=llama-7b-zero3
#SBATCH --partition=gpu
#SBATCH --account=proj-42
#SBATCH --qos=high
#SBATCH --time=1-00:00:00
#SBATCH --nodes=4
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
rm -f "$FTL_RUN_DIR"/preempt.requested "$FTL_RUN_DIR"/preempted

# USR1 (--signal=B:USR1@grace, or `scancel -b -s USR1`): ask the ranks to save a
# checkpoint at the next step boundary and stop; the end of this script requeues.
ftl_preempt() {
    echo "ftl: USR1 at $(date +%FT%T): checkpointing at the next step, then requeue"
    touch "$FTL_RUN_DIR"/preempt.requested
}
trap ftl_preempt USR1

# cluster.setup (run as written)
module load cuda/12.4
source /opt/venv/bin/activate

export PYTHONUNBUFFERED=1
FTL_HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"
export FTL_HEAD_NODE
echo "ftl: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST, head node $FTL_HEAD_NODE, run dir $FTL_RUN_DIR"

# One task per node: it starts this node's ranks (node rank = SLURM_NODEID).
srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=32 \
    bash -c 'export FTL_NODE_RANK="$SLURM_NODEID"; exec torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "${FTL_HEAD_NODE}":29500 --rdzv_id llama-7b-zero3-20260101-000000 --log_dir "${FTL_RUN_DIR}"/logs/node-"${FTL_NODE_RANK}" --redirects 3 --tee 0:3 --module launcher.worker "${FTL_RUN_DIR}"' &
step=$!
# wait returns early (status > 128) when the trap ran; then keep waiting for the step.
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
if [ -e "$FTL_RUN_DIR"/preempt.requested ]; then
    restarts=${SLURM_RESTART_COUNT:-0}
    if [ "$restarts" -lt 5 ]; then
        echo "ftl: requeueing (restart $((restarts + 1)) of 5); the rerun resumes from the latest complete checkpoint"
        scontrol requeue "$SLURM_JOB_ID" && exit 0
        echo "ftl: scontrol requeue failed"
    else
        echo "ftl: not requeueing: cluster.slurm.max_restarts=5 reached"
    fi
fi
[ "$rc" -eq 0 ] && rc=1  # the ranks stopped early: the run is not done
echo "ftl: the run did not finish (exit code $rc); rank logs: $FTL_RUN_DIR/logs"
exit "$rc"
