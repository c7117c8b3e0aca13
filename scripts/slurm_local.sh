#!/usr/bin/env bash
# A real 2-node SLURM cluster on this machine, for tests and demos.
#
#   bash scripts/slurm_local.sh install   # apt-get slurm-wlm + munge (root, Debian)
#   bash scripts/slurm_local.sh start     # write the config, start munged, slurmctld, 2 slurmd
#   bash scripts/slurm_local.sh status    # sinfo
#   bash scripts/slurm_local.sh stop      # scontrol shutdown
#
# Two NodeNames share 127.0.0.1 with distinct ports and per-node (%n) spool, pid and log paths
# (one shared path makes the second node unreachable); both nodes share the same cores, so the
# partition oversubscribes. Node names resolve through /etc/hosts, as submitit's hostnames and
# the rendezvous of the distributed models need. State lives in $DISTBENCH_SLURM_DIR
# (default /tmp/distbench-slurm). A job credential lives 10 s (cred_expire; SLURM's default is
# 120 s, its least 5 s; a job's or step's credential is checked as it is launched, moments after
# it is made): it is also how long SLURM holds a re-queued job before it may start again (the
# re-queue test waits that long), and starting it sooner (scontrol update StartTime=now) kills
# it with "Job credential revoked". The scheduler looks at pending jobs every second
# (SchedulerParameters; 60 s and 30 s by default), so a re-queued job starts once its hold
# ends instead of at the next pass.
set -euo pipefail

state="${DISTBENCH_SLURM_DIR:-/tmp/distbench-slurm}"
conf_dir=/etc/slurm
nodes=(node1 node2)

installed() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null
}

install() {
    if installed; then
        echo "[slurm] installed"; return
    fi
    [ "$(id -u)" = 0 ] || { echo "[slurm] installing needs root" >&2; exit 1; }
    # One installer at a time (the tests' two processes may both need SLURM): apt-get refuses
    # to start while another holds its lock; the second finds it installed once the first ends.
    exec 9>/tmp/distbench-slurm-install.lock
    flock 9
    if ! installed; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    fi
    exec 9>&-
}

write_config() {
    local cpus mem
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
    mkdir -p "$state"/{spool-node1,spool-node2,ctld} "$conf_dir"
    cat > "$conf_dir/slurm.conf" <<CONF
ClusterName=distbench
SlurmctldHost=localhost
AuthType=auth/munge
AuthInfo=cred_expire=10
SlurmUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=1,bf_interval=1
NodeName=node[1-2] NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=17001-17002 CPUs=$cpus RealMemory=$mem
PartitionName=local Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    for node in "${nodes[@]}"; do
        grep -qE "^127\.0\.0\.1[[:space:]].*\b$node\b" /etc/hosts || echo "127.0.0.1 $node" >> /etc/hosts
    done
}

# Whether a live process matches (pgrep's arguments): a zombie does not count. A daemon that
# ended but is not reaped yet (this machine's init reaps late) would otherwise pass for a
# running one, and `start` right after `stop` (or after the emulated cluster's tear-down) would
# not start its own: seen as "Unable to contact slurm controller" for 5 minutes.
live() {
    pgrep -r R,S,D,T,t,I "$@" >/dev/null
}

start() {
    install
    write_config
    mkdir -p /run/munge && chown munge:munge /run/munge
    # munged only if none runs, noted so that `stop` ends it again (as launchers/emulated.py does):
    # the test cluster leaves no daemon of its own behind.
    if ! live -x munged; then
        sudo_munge
        touch "$state/munged-started-here"
    fi
    # -c: start from a clean state; jobs of an earlier run of this test cluster are not resumed.
    live -x slurmctld || slurmctld -c
    for node in "${nodes[@]}"; do
        live -f "slurmd -N $node" || slurmd -N "$node"
    done
    for _ in $(seq 1 30); do
        if [ "$(sinfo -h -o '%T' | grep -cE '^(idle|mixed|allocated)')" -ge 1 ] \
            && [ "$(sinfo -h -N -o '%N %T' | grep -cE 'idle|mixed|allocated')" -eq 2 ]; then
            echo "[slurm] up:"; sinfo -N; return
        fi
        sleep 1
    done
    echo "[slurm] nodes did not come up; logs in $state" >&2; sinfo -N >&2; exit 1
}

sudo_munge() {
    if command -v runuser >/dev/null; then runuser -u munge -- munged; else munged --force; fi
}

stop() {
    # Cancel the jobs first: their tasks (slurmstepd and what it started) outlive the daemons.
    if scontrol ping >/dev/null 2>&1; then
        squeue -h -o %i | xargs -r scancel --full 2>/dev/null || true
        for _ in $(seq 1 40); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 1
        done
    fi
    scontrol shutdown 2>/dev/null || true
    pkill -x slurmd 2>/dev/null || true
    # Wait until they are gone, so that an immediate `start` does not mistake a daemon that is
    # still shutting down for a running one.
    for _ in $(seq 1 20); do
        live -x slurmctld || live -x slurmd || break
        sleep 1
    done
    pkill -9 -x slurmctld 2>/dev/null || true
    pkill -9 -x slurmd 2>/dev/null || true
    pkill -9 -x slurmstepd 2>/dev/null || true
    if [ -e "$state/munged-started-here" ]; then
        pkill -x munged 2>/dev/null || true
        # gone before returning: a `start` right after must not take a dying munged for a live one
        for _ in $(seq 1 20); do live -x munged || break; sleep 0.5; done
        pkill -9 -x munged 2>/dev/null || true
        rm -f "$state/munged-started-here"
    fi
    echo "[slurm] stopped"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    status) sinfo -N ;;
    stop) stop ;;
    *) echo "usage: $0 install|start|status|stop" >&2; exit 2 ;;
esac
