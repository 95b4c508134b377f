#!/usr/bin/env bash
# A throw-away Slurm on this machine for tests: one controller and two slurmd "nodes"
# (node1, node2) on 127.0.0.1, started as root without systemd, stopped by PID.
#
#   scripts/slurm-local.sh up       # install if missing, (re)start, wait until nodes are idle
#   scripts/slurm-local.sh status   # daemons and sinfo
#   scripts/slurm-local.sh down     # cancel jobs, stop the daemons by PID
#
# Idempotent: `up` on a running cluster with the same config returns at once. The config
# goes to /etc/slurm/slurm.conf (where sbatch/sinfo look); an existing config that this
# script did not write is never overwritten. Settings and why: docs/evidence/stack.md
# ("A real Slurm on one host"). Debian 12 packages (slurm 22.05).
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MARKER="# written by ftlaunch scripts/slurm-local.sh"
RUN=/run/ftl-slurm
STATE=/var/lib/ftl-slurm
LOGS=/var/log/ftl-slurm
NODES=(node1 node2)
PORTS=(17001 17002)
CTLD_PORT=16817
# Each node claims 2 CPUs (SlurmdParameters=config_overrides lets both "nodes" claim the
# same 2 real cores), so one job can run 1-2 processes on each node.
CPUS_PER_NODE=2
MUNGE_PID=/run/munge/munged.pid

log() { echo "slurm-local: $*" >&2; }
die() { log "error: $*"; exit 1; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends munge slurm-client slurmctld slurmd >/dev/null
}

ensure_hosts() {
    # node names must resolve (MASTER_ADDR / rendezvous endpoint is a node name).
    if ! grep -Eq '^127\.0\.0\.1[[:space:]]+node1[[:space:]]+node2([[:space:]]|$)' /etc/hosts; then
        echo "127.0.0.1 node1 node2" >>/etc/hosts
    fi
    local host
    host=$(hostname)
    getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >>/etc/hosts
}

start_munge() {
    if alive "$MUNGE_PID" && munge -n </dev/null | unmunge >/dev/null 2>&1; then return 0; fi
    mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    chmod 0400 /etc/munge/munge.key
    rm -f "$MUNGE_PID" /run/munge/munge.socket.2*
    # munged refuses to run as root; it daemonizes and writes its own pid file.
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n </dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "munged did not start (see /var/log/munge/munged.log)"
}

render_conf() {
    local host
    host=$(hostname)
    cat <<EOF
$MARKER
ClusterName=ftlocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job otherwise waits ~120 s for its old credential to expire.
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
# pgid: linuxproc leaked a child that ignored SIGTERM. task/none: no cgroups needed.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmdTimeout=300
NodeName=node1 NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[0]} CPUs=$CPUS_PER_NODE RealMemory=4000 State=UNKNOWN
NodeName=node2 NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[1]} CPUs=$CPUS_PER_NODE RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF
}

write_conf() {
    # Prints "changed" when the file on disk had to be (re)written.
    local wanted
    wanted=$(render_conf)
    if [ -e "$CONF" ] && ! head -n1 "$CONF" | grep -qxF "$MARKER"; then
        die "$CONF exists and was not written by this script; move it away to use a local test cluster"
    fi
    if [ -e "$CONF" ] && [ "$(cat "$CONF")" = "$wanted" ]; then return 0; fi
    mkdir -p "$CONF_DIR"
    printf '%s\n' "$wanted" >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
    echo changed
}

daemons_alive() {
    alive "$RUN/slurmctld.pid" || return 1
    local node
    for node in "${NODES[@]}"; do alive "$RUN/slurmd-$node.pid" || return 1; done
}

nodes_idle() {
    local states
    states=$(sinfo -h -N -o '%t' 2>/dev/null | sort -u | tr '\n' ' ') || return 1
    # idle (free), mix/alloc (running jobs): all are "up".
    [ -n "$states" ] && ! echo "$states" | grep -Eqv '^((idle|mix|alloc) )+$'
}

start_slurm() {
    mkdir -p "$RUN" "$LOGS" "$STATE/slurmctld"
    local node
    for node in "${NODES[@]}"; do mkdir -p "$STATE/slurmd/$node"; done
    # -c: start from a clean state (a throw-away cluster), -i: ignore unreadable state.
    slurmctld -c -i
    for node in "${NODES[@]}"; do slurmd -N "$node"; done
}

wait_idle() {
    for _ in $(seq 120); do
        nodes_idle && return 0
        sleep 0.5
    done
    sinfo -N >&2 || true
    die "nodes did not become idle; logs in $LOGS"
}

stop_pid_file() {
    local file=$1 pid
    [ -s "$file" ] || return 0
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

cmd_up() {
    [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts daemons)"
    install_packages
    ensure_hosts
    start_munge
    local changed
    changed=$(write_conf)
    if [ -z "$changed" ] && daemons_alive; then
        wait_idle
        log "already up"
        sinfo
        return 0
    fi
    stop_slurm
    start_slurm
    wait_idle
    log "up"
    sinfo
}

stop_slurm() {
    local node
    for node in "${NODES[@]}"; do stop_pid_file "$RUN/slurmd-$node.pid"; done
    stop_pid_file "$RUN/slurmctld.pid"
}

cmd_down() {
    if alive "$RUN/slurmctld.pid"; then
        # Jobs' steps outlive slurmd; cancel them while the controller can still do it.
        squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
        for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
    fi
    stop_slurm
    stop_pid_file "$MUNGE_PID"
    log "down"
}

cmd_status() {
    local file rc=0
    for file in "$RUN/slurmctld.pid" "$RUN/slurmd-node1.pid" "$RUN/slurmd-node2.pid" "$MUNGE_PID"; do
        if alive "$file"; then echo "running  $(basename "$file" .pid) pid $(cat "$file")"
        else echo "stopped  $(basename "$file" .pid)"; rc=1; fi
    done
    sinfo -N 2>/dev/null || rc=1
    return $rc
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
