#!/usr/bin/env bash
# start-local-slurm.sh -- install (if needed) and start a single-host, multi-node
# Slurm cluster with fake GPUs, for running real `sbatch` jobs in tests.
# (launchgen's copy of the team recipe; .ci/run starts it, tests/slurm/conftest.py starts it when it can.
#  Differences: partitions default to debug,gpu, since the bundled examples name `gpu`.)
#
# Debian 12 (bookworm) packages: slurmctld/slurmd/slurm-client 22.05.8 + munge.
# Works without systemd: every daemon is started by hand and tracked by PID file.
#
# Usage:  start-local-slurm.sh [-n NODES] [-g GPUS_PER_NODE] [-c CPUS_PER_NODE]
#                              [-m MEM_MB_PER_NODE] [-t GPU_TYPE] [-p NODE_PREFIX]
#                              [-P BASE_PORT] [-T WAIT_SECONDS] [-q PARTITIONS]
#                              [-f FEATURES] [-A]
#   (each option also has an environment variable, see the defaults below)
#
# Result: nodes ${PREFIX}1..${PREFIX}N (default node[1-5]), each served by its own
# slurmd (`slurmd -N nodeX`) on 127.0.0.1:<BASE_PORT+i>, each with GPUS fake GPUs
# (Gres=gpu[:TYPE]:GPUS, gres.conf File= symlinks to /dev/null, so Slurm exports
# CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS for steps that get GPUs),
# partition(s) -q "debug" (comma list, all nodes, first one default), node
# features -f (comma list, e.g. "h100"), JobCompType=jobcomp/filetxt. The node names are
# added to /etc/hosts as 127.0.0.1 (LOCAL_SLURM_ETC_HOSTS=0 to skip that).
# -A / LOCAL_SLURM_ACCOUNTING=1: also install MariaDB + slurmdbd so `sacct` works
# (about +11 s of install, +2 s of start; without it `sacct` says
# "Slurm accounting storage is disabled"; `scontrol show job` works either way).
# LOCAL_SLURM_PROCTRACK=cgroup switches to proctrack/cgroup (kills daemonized
# leftovers of a job; needs a writable cgroup tree), default proctrack/linuxproc.
#
# Idempotent: re-running with the same parameters while the cluster is up only
# checks it; different parameters restart the Slurm daemons with the new config
# (and wipe controller state, spool dirs and the accounting database).
set -euo pipefail

NODES="${LOCAL_SLURM_NODES:-5}"
GPUS="${LOCAL_SLURM_GPUS_PER_NODE:-8}"
CPUS="${LOCAL_SLURM_CPUS_PER_NODE:-16}"
MEM_MB="${LOCAL_SLURM_MEM_MB:-64000}"
GPU_TYPE="${LOCAL_SLURM_GPU_TYPE:-}"
PREFIX="${LOCAL_SLURM_NODE_PREFIX:-node}"
BASE_PORT="${LOCAL_SLURM_BASE_PORT:-17000}"
CTLD_PORT="${LOCAL_SLURM_CTLD_PORT:-6817}"
DBD_PORT="${LOCAL_SLURM_DBD_PORT:-6819}"
WAIT_S="${LOCAL_SLURM_WAIT_SECONDS:-60}"
ETC_HOSTS="${LOCAL_SLURM_ETC_HOSTS:-1}"           # 1: node names resolve to 127.0.0.1
PROCTRACK="${LOCAL_SLURM_PROCTRACK:-linuxproc}"   # linuxproc | cgroup
ACCOUNTING="${LOCAL_SLURM_ACCOUNTING:-0}"         # 1: slurmdbd + MariaDB (sacct)
PARTITIONS="${LOCAL_SLURM_PARTITIONS:-debug,gpu}" # comma list; the first is the default (gpu: the examples name it)
FEATURES="${LOCAL_SLURM_FEATURES:-}"              # comma list of node features (--constraint)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit "${1:-0}"; }
while getopts "n:g:c:m:t:p:P:T:q:f:Ah" opt; do
  case "$opt" in
    n) NODES="$OPTARG" ;; g) GPUS="$OPTARG" ;; c) CPUS="$OPTARG" ;;
    m) MEM_MB="$OPTARG" ;; t) GPU_TYPE="$OPTARG" ;; p) PREFIX="$OPTARG" ;;
    P) BASE_PORT="$OPTARG" ;; T) WAIT_S="$OPTARG" ;; A) ACCOUNTING=1 ;;
    q) PARTITIONS="$OPTARG" ;; f) FEATURES="$OPTARG" ;;
    h) usage 0 ;; *) usage 2 ;;
  esac
done
for v in NODES GPUS CPUS MEM_MB BASE_PORT CTLD_PORT DBD_PORT WAIT_S; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "error: $v must be an integer (got '${!v}')" >&2; exit 2; }
done
(( NODES >= 1 )) || { echo "error: need at least 1 node" >&2; exit 2; }
[[ "$PROCTRACK" == linuxproc || "$PROCTRACK" == cgroup ]] || { echo "error: LOCAL_SLURM_PROCTRACK must be linuxproc or cgroup" >&2; exit 2; }
[[ "$ACCOUNTING" == 0 || "$ACCOUNTING" == 1 ]] || { echo "error: LOCAL_SLURM_ACCOUNTING must be 0 or 1" >&2; exit 2; }

log() { echo "[local-slurm] $*" >&2; }
die() { echo "[local-slurm] ERROR: $*" >&2; exit 1; }
[[ $EUID -eq 0 ]] || die "must run as root (installs packages, starts slurmd)"

CONF_DIR=/etc/slurm
RUN_DIR=/run/slurm
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm/slurmctld
SPOOL_BASE=/var/lib/slurm/slurmd
FAKE_GPU_DIR=/run/slurm-fakegpu
MARK_DIR=/run/local-slurm      # PIDs of the daemons *we* started (stop script uses these)
DB_NAME=slurm_acct_db
T_START=$(date +%s.%N)
HERE=$(dirname "$(readlink -f "$0")")

# ---------------------------------------------------------------- install ----
pkgs=(munge slurmctld slurmd slurm-client)
(( ACCOUNTING )) && pkgs+=(slurmdbd mariadb-server)
need_pkgs=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if ((${#need_pkgs[@]})); then
  log "installing ${need_pkgs[*]} ..."
  # Keep apt/dpkg from trying to start the daemons (no systemd here; the
  # slurm units would fail anyway without slurm.conf). Only if no policy exists.
  tmp_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    tmp_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt_ok=1
  if ! apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/tmp/local-slurm-apt.log 2>&1; then
    log "apt-get install failed, running apt-get update and retrying"
    apt-get update -q >>/tmp/local-slurm-apt.log 2>&1 || true
    apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >>/tmp/local-slurm-apt.log 2>&1 || apt_ok=0
  fi
  if [[ -n $tmp_policy ]]; then rm -f /usr/sbin/policy-rc.d; fi
  (( apt_ok )) || { tail -20 /tmp/local-slurm-apt.log >&2; die "apt-get install failed (log: /tmp/local-slurm-apt.log)"; }
fi
T_INSTALLED=$(date +%s.%N)

mkdir -p "$MARK_DIR" "$RUN_DIR" "$LOG_DIR" "$STATE_DIR" "$SPOOL_BASE"

alive() { # alive PIDFILE COMM -> true if the pid in PIDFILE runs a process named COMM
  local pid; [[ -s "$1" ]] || return 1; pid=$(<"$1")
  [[ "$pid" =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/comm ]] && [[ "$(</proc/$pid/comm)" == "$2"* ]]
}

# ------------------------------------------------------------------ munge ----
if [[ ! -s /etc/munge/munge.key ]]; then
  log "creating munge key"
  if command -v mungekey >/dev/null; then mungekey --create --force --keyfile=/etc/munge/munge.key
  else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged      # forks into the background itself
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged did not come up (see /var/log/munge/munged.log)"
  cp /run/munge/munged.pid "$MARK_DIR/munged.pid"
fi

# ------------------------------------------------ MariaDB (accounting only) ----
if (( ACCOUNTING )); then
  if ! mariadb -e 'SELECT 1' >/dev/null 2>&1; then
    log "starting mariadbd"
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    # mariadbd stays in the foreground: detach it; it writes its own PID file
    setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 \
      --pid-file=/run/mysqld/mysqld.pid >>/var/log/local-slurm-mariadb.log 2>&1 < /dev/null &
    for _ in $(seq 300); do mariadb -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
    mariadb -e 'SELECT 1' >/dev/null 2>&1 || { tail -20 /var/log/local-slurm-mariadb.log >&2; die "mariadbd did not come up"; }
    cp /run/mysqld/mysqld.pid "$MARK_DIR/mariadbd.pid"
  fi
  # root connects through the unix socket (Debian's default unix_socket auth)
  DB_PASS_FILE=/etc/slurm/.local-slurm-dbpass
  [[ -s $DB_PASS_FILE ]] || { head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$DB_PASS_FILE"; chmod 600 "$DB_PASS_FILE"; }
  DB_PASS=$(<"$DB_PASS_FILE")
  mariadb -e "CREATE DATABASE IF NOT EXISTS ${DB_NAME};
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${DB_PASS}';
    ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${DB_PASS}';
    GRANT ALL ON ${DB_NAME}.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
fi

# ----------------------------------------------------------------- config ----
HOST=$(hostname -s)
gres_spec="gpu:${GPUS}"; [[ -n "$GPU_TYPE" ]] && gres_spec="gpu:${GPU_TYPE}:${GPUS}"
type_kv=""; [[ -n "$GPU_TYPE" ]] && type_kv=" Type=${GPU_TYPE}"
NODELIST="${PREFIX}[1-${NODES}]"; (( NODES == 1 )) && NODELIST="${PREFIX}1"
gres_kv=" Gres=${gres_spec}"; (( GPUS > 0 )) || gres_kv=""
feat_kv=""; [[ -n "$FEATURES" ]] && feat_kv=" Features=${FEATURES}"
[[ "$PARTITIONS" =~ ^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$ ]] || die "bad partition list '$PARTITIONS'"

if (( ACCOUNTING )); then
  acct_conf="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=${DBD_PORT}
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux"
else
  acct_conf="AccountingStorageType=accounting_storage/none
# (AccountingStorageTRES=gres/gpu needs slurmdbd: without it slurmctld dies with
#  \"fatal: slurmdbd is required to run with TRES gres/gpu\")
JobAcctGatherType=jobacct_gather/none"
fi

new_conf=$(mktemp); new_gres=$(mktemp)
{
  cat <<EOF
# Generated by start-local-slurm.sh -- single host, ${NODES} logical nodes, fake GPUs.
ClusterName=localcluster
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=${STATE_DIR}
SlurmdSpoolDir=${SPOOL_BASE}/%n
SlurmctldPidFile=${RUN_DIR}/slurmctld.pid
SlurmdPidFile=${RUN_DIR}/slurmd-%n.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# process tracking: linuxproc = no cgroups needed (processes that daemonize
# themselves escape job cleanup); cgroup = opt-in, needs a usable cgroup tree
ProctrackType=proctrack/${PROCTRACK}
TaskPlugin=task/none
${acct_conf}
JobCompType=jobcomp/filetxt
JobCompLoc=${LOG_DIR}/jobcomp.log
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
SchedulerType=sched/backfill
# heterogeneous jobs are only started by the backfill scheduler (default every 30 s)
SchedulerParameters=bf_interval=1
# reject impossible requests (e.g. more nodes than exist) at submit time instead of pending forever
EnforcePartLimits=ALL
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# the declared CPUs/memory/GPUs are fake: trust slurm.conf, not the hardware
SlurmdParameters=config_overrides
ReturnToService=2
# keep finished jobs visible to 'scontrol show job' for an hour
MinJobAge=3600
SlurmdTimeout=60
SlurmctldTimeout=60
InactiveLimit=0
KillWait=5
Waittime=0
EOF
  for ((i = 1; i <= NODES; i++)); do
    echo "NodeName=${PREFIX}${i} NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=$((BASE_PORT + i)) CPUs=${CPUS} RealMemory=${MEM_MB}${gres_kv}${feat_kv} State=UNKNOWN"
  done
  default=YES
  for part in ${PARTITIONS//,/ }; do
    echo "PartitionName=${part} Nodes=${NODELIST} Default=${default} MaxTime=INFINITE State=UP OverSubscribe=NO"
    default=NO
  done
} > "$new_conf"
{
  echo "# Generated by start-local-slurm.sh -- fake GPUs (symlinks to /dev/null)"
  echo "AutoDetect=off"
  if (( GPUS > 0 )); then
    if (( GPUS == 1 )); then files="$FAKE_GPU_DIR/nvidia0"; else files="$FAKE_GPU_DIR/nvidia[0-$((GPUS - 1))]"; fi
    echo "NodeName=${NODELIST} Name=gpu${type_kv} File=${files}"
  fi
} > "$new_gres"

changed=0
cmp -s "$new_conf" "$CONF_DIR/slurm.conf" || changed=1
cmp -s "$new_gres" "$CONF_DIR/gres.conf" || changed=1

ctld_up() { alive "$RUN_DIR/slurmctld.pid" slurmctld; }
dbd_up() { alive "$RUN_DIR/slurmdbd.pid" slurmdbd; }
slurmd_up() { alive "$RUN_DIR/slurmd-$1.pid" slurmd; }
any_up=0; ctld_up && any_up=1; dbd_up && any_up=1
for f in "$RUN_DIR"/slurmd-*.pid; do [[ -e $f ]] && alive "$f" slurmd && any_up=1; done

if (( changed && any_up )); then
  log "configuration changed: stopping the running Slurm daemons first"
  "$HERE/stop-local-slurm.sh" --keep-base --purge
fi

# ----------------------------------------------------------- fake GPUs -------
mkdir -p "$FAKE_GPU_DIR"
for ((i = 0; i < GPUS; i++)); do
  f="$FAKE_GPU_DIR/nvidia$i"
  [[ -c "$f" ]] && continue
  # Slurm's gpu plugin needs File= to be a character/block device (a plain file
  # gives "is not a valid character or block device" and no CUDA_VISIBLE_DEVICES;
  # no File= at all gives "Removing file-less GPU" -> node INVAL). A symlink to
  # /dev/null passes its stat() check and needs no mknod privilege.
  rm -f "$f"; ln -s /dev/null "$f"
done

if (( changed )); then
  install -m 644 "$new_conf" "$CONF_DIR/slurm.conf"
  install -m 644 "$new_gres" "$CONF_DIR/gres.conf"
  if [[ "$PROCTRACK" == cgroup ]]; then
    printf 'CgroupPlugin=autodetect\nCgroupAutomount=yes\nConstrainDevices=no\nConstrainCores=no\nConstrainRAMSpace=no\n' > "$CONF_DIR/cgroup.conf"
  else
    rm -f "$CONF_DIR/cgroup.conf"
  fi
  # fresh controller state (and accounting records) for the new node set
  rm -rf "${STATE_DIR:?}"/* "${SPOOL_BASE:?}"/* 2>/dev/null || true
  if (( ACCOUNTING )); then mariadb -e "DROP DATABASE IF EXISTS ${DB_NAME}; CREATE DATABASE ${DB_NAME};"; fi
fi
rm -f "$new_conf" "$new_gres"

# node names -> 127.0.0.1, so e.g. http://node1:8000 works from any "node"
if [[ "$ETC_HOSTS" == 1 ]]; then
  names=""; for ((i = 1; i <= NODES; i++)); do names+=" ${PREFIX}${i}"; done
  line="127.0.0.1${names} # local-slurm"
  if ! grep -qxF "$line" /etc/hosts; then
    { grep -v ' # local-slurm$' /etc/hosts || true; echo "$line"; } > /tmp/local-slurm-hosts
    cat /tmp/local-slurm-hosts > /etc/hosts   # rewrite in place: /etc/hosts may be a bind mount
    rm -f /tmp/local-slurm-hosts
  fi
fi

# ---------------------------------------------------------------- daemons ----
if (( ACCOUNTING )) && ! dbd_up; then
  log "starting slurmdbd"
  cat > "$CONF_DIR/slurmdbd.conf" <<EOF
# Generated by start-local-slurm.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=${DBD_PORT}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=${DB_PASS}
StorageLoc=${DB_NAME}
LogFile=${LOG_DIR}/slurmdbd.log
PidFile=${RUN_DIR}/slurmdbd.pid
EOF
  chmod 600 "$CONF_DIR/slurmdbd.conf"
  rm -f "$RUN_DIR/slurmdbd.pid"
  /usr/sbin/slurmdbd
  for _ in $(seq 100); do dbd_up && sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.1; done
  dbd_up || { tail -20 "$LOG_DIR/slurmdbd.log" >&2; die "slurmdbd did not start"; }
  cp "$RUN_DIR/slurmdbd.pid" "$MARK_DIR/slurmdbd.pid"
fi
if ! ctld_up; then
  log "starting slurmctld"
  rm -f "$RUN_DIR/slurmctld.pid"
  /usr/sbin/slurmctld -i
  for _ in $(seq 100); do ctld_up && scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
  ctld_up || { tail -20 "$LOG_DIR/slurmctld.log" >&2; die "slurmctld did not start"; }
  cp "$RUN_DIR/slurmctld.pid" "$MARK_DIR/slurmctld.pid"
fi
for ((i = 1; i <= NODES; i++)); do
  n="${PREFIX}${i}"
  slurmd_up "$n" && continue
  log "starting slurmd for $n (port $((BASE_PORT + i)))"
  mkdir -p "$SPOOL_BASE/$n"
  rm -f "$RUN_DIR/slurmd-$n.pid"
  /usr/sbin/slurmd -N "$n"
  for _ in $(seq 50); do slurmd_up "$n" && break; sleep 0.1; done
  slurmd_up "$n" || { tail -20 "$LOG_DIR/slurmd-$n.log" >&2; die "slurmd -N $n did not start"; }
  cp "$RUN_DIR/slurmd-$n.pid" "$MARK_DIR/slurmd-$n.pid"
done

# ------------------------------------------------------------ wait ready -----
log "waiting for ${NODES} node(s) to be idle ..."
deadline=$(( $(date +%s) + WAIT_S ))
while :; do
  states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)
  n_ready=$(awk '$2 ~ /^(idle|mixed|allocated|completing)$/' <<<"$states" | wc -l)
  (( n_ready == NODES )) && break
  # nodes left DOWN/DRAINED from an earlier life (e.g. "Not responding") -> resume
  down=$(awk '$2 ~ /down|drain/ {print $1}' <<<"$states" | paste -sd, -)
  if [[ -n "$down" ]]; then scontrol update nodename="$down" state=resume >/dev/null 2>&1 || true; fi
  if (( $(date +%s) > deadline )); then
    echo "$states" >&2; tail -5 "$LOG_DIR/slurmctld.log" >&2
    die "nodes not idle after ${WAIT_S}s"
  fi
  sleep 0.5
done
if (( ACCOUNTING )); then  # slurmctld registers the cluster with slurmdbd by itself
  for _ in $(seq 50); do sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx localcluster && break; sleep 0.2; done
fi
T_END=$(date +%s.%N)
log "$(awk -v n="$NODES" -v g="$GPUS" -v a="$T_START" -v b="$T_INSTALLED" -v c="$T_END" \
  'BEGIN { printf "ready: %d node(s) x %d fake GPU(s); install %.1fs, start %.1fs, total %.1fs", n, g, b-a, c-b, c-a }')"
sinfo -N -o '%N %P %T %c %m %G %f' >&2
