#!/usr/bin/env bash
# A real 2-node SLURM cluster on this machine, for tests and demos.
#
#   bash scripts/slurm_local.sh install   # apt-get slurm-wlm + munge (root, Debian)
#   bash scripts/slurm_local.sh start     # write the config, start munged, slurmctld, 2 slurmd
#   bash scripts/slurm_local.sh status    # sinfo
#   bash scripts/slurm_local.sh stop      # cancel its jobs, stop what start started, undo its files
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
#
# On a shared machine: `start` notes under $DISTBENCH_SLURM_DIR what it starts (the daemons'
# pid files, munged's id where it started one) and what it writes outside it (the hosts lines,
# marked; the slurm.conf it replaced, kept). `stop` stops those processes by their ids, never by
# name, cancels jobs only on the controller it started, puts slurm.conf and /etc/hosts back as
# they were, and touches nothing when nothing was started here. `start` refuses to run beside a
# SLURM controller it did not start.
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

conf_mark="# Written by scripts/slurm_local.sh (distbench); stop puts back what was here."
hosts_mark="# distbench-slurm-local"

write_config() {
    local cpus mem
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
    mkdir -p "$state"/{spool-node1,spool-node2,ctld} "$conf_dir"
    # Another cluster's slurm.conf is kept once, to be put back by stop.
    if [ -e "$conf_dir/slurm.conf" ] && ! head -1 "$conf_dir/slurm.conf" | grep -qxF "$conf_mark" \
        && [ ! -e "$state/slurm.conf.before" ]; then
        cp -p "$conf_dir/slurm.conf" "$state/slurm.conf.before"
    fi
    cat > "$conf_dir/slurm.conf" <<CONF
$conf_mark
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
        grep -qE "^127\.0\.0\.1[[:space:]].*\b$node\b" /etc/hosts \
            || echo "127.0.0.1 $node $hosts_mark" >> /etc/hosts
    done
}

# The noted process of a pid file, if it still runs under that name (a pid the kernel gave to
# another program since is not ours).
noted_pid() {  # <pid file> <process name>
    local pid
    pid=$(cat "$1" 2>/dev/null || true)
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] \
        && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && echo "$pid"
    return 0
}

# SIGTERM a noted process, SIGKILL it if it outlives 20 s, and wait until it is gone.
end_noted() {  # <pid file> <process name>
    local pid
    pid=$(noted_pid "$1" "$2")
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do [ -n "$(noted_pid "$1" "$2")" ] || return 0; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 10); do [ -n "$(noted_pid "$1" "$2")" ] || return 0; sleep 0.5; done
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
    local controller
    controller=$(noted_pid "$state/slurmctld.pid" slurmctld)
    if [ -z "$controller" ] && live -x slurmctld; then
        echo "[slurm] another SLURM controller runs on this machine (pid $(pgrep -x slurmctld | tr '\n' ' ')); stop it first" >&2
        exit 1
    fi
    mkdir -p "$state"
    touch "$state/started-here"  # first: stop finds whatever is made from here on
    write_config
    mkdir -p /run/munge && chown munge:munge /run/munge
    # munged only if none runs, its id noted so that `stop` ends it again (as launchers/emulated.py
    # does): the test cluster leaves no daemon of its own behind.
    if ! live -x munged; then
        sudo_munge
        for _ in $(seq 1 50); do
            [ -s /run/munge/munged.pid ] && break
            sleep 0.1
        done
        cp /run/munge/munged.pid "$state/munged.pid"
    fi
    # -c: start from a clean state; jobs of an earlier run of this test cluster are not resumed.
    [ -n "$controller" ] || slurmctld -c
    for node in "${nodes[@]}"; do
        [ -n "$(noted_pid "$state/slurmd-$node.pid" slurmd)" ] || slurmd -N "$node"
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

ours_conf() {
    head -1 "$conf_dir/slurm.conf" 2>/dev/null | grep -qxF "$conf_mark"
}

stop() {
    if [ ! -e "$state/started-here" ]; then
        echo "[slurm] nothing was started here ($state): nothing touched"; return
    fi
    # Cancel the jobs first (only on the controller started here): their tasks (slurmstepd and
    # what it started) outlive the daemons.
    if [ -n "$(noted_pid "$state/slurmctld.pid" slurmctld)" ] && ours_conf \
        && scontrol ping >/dev/null 2>&1; then
        squeue -h -o %i | xargs -r scancel --full 2>/dev/null || true
        for _ in $(seq 1 40); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 1
        done
        scontrol shutdown 2>/dev/null || true
    fi
    # Gone before returning: an immediate `start` must not take a dying daemon for a live one.
    end_noted "$state/slurmctld.pid" slurmctld
    for node in "${nodes[@]}"; do end_noted "$state/slurmd-$node.pid" slurmd; done
    end_noted "$state/munged.pid" munged
    rm -f "$state/munged.pid"
    if ours_conf; then
        if [ -e "$state/slurm.conf.before" ]; then
            cp -p "$state/slurm.conf.before" "$conf_dir/slurm.conf" && rm -f "$state/slurm.conf.before"
        else
            rm -f "$conf_dir/slurm.conf"
        fi
    fi
    # In place (sed -i renames, and /etc/hosts may be a bind mount): the marked lines only.
    if grep -qF "$hosts_mark" /etc/hosts; then
        local kept
        kept=$(grep -vF "$hosts_mark" /etc/hosts || true)
        printf '%s\n' "$kept" > /etc/hosts
    fi
    rm -f "$state/started-here"
    echo "[slurm] stopped"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    status) sinfo -N ;;
    stop) stop ;;
    *) echo "usage: $0 install|start|status|stop" >&2; exit 2 ;;
esac
