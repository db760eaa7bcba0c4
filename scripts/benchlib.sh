# shellcheck shell=bash
# Helpers the bench scripts share (sourced, not run): ports, process and Redis CPU, the load.
# The caller sets BIN (a temporary folder) and, for the Redis helpers, RPORT.

# free_port prints a loopback port nothing listens on (other work shares the machine).
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# wait_port PORT waits up to 30 s for PORT to accept connections.
wait_port() {
  for _ in $(seq 1 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "bench: port $1 never opened" >&2
  return 1
}

# cpu_ticks PID prints the process's utime+stime in clock ticks.
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

# children_cpu VAR sets VAR to the user+system seconds of the shell's finished children (the
# load generator's, once it has exited). It must run in the shell itself, not in $(...), whose
# subshell's counts start at zero.
children_cpu() {
  times >"$BIN/times"
  printf -v "$1" '%s' "$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); s += t[1] * 60 + t[2] } } END { printf "%.3f", s }' "$BIN/times")"
}

# host_idle prints the host's idle time in clock ticks, summed over its CPUs.
host_idle() { awk '/^cpu /{print $5 + $6}' /proc/stat; }

# redis_cpu prints Redis's used_cpu_sys+used_cpu_user in seconds, summed over RPORTS (every
# node of a cluster) when set.
redis_cpu() {
  local p
  for p in ${RPORTS:-$RPORT}; do redis-cli -p "$p" info cpu; done | tr -d '\r' |
    awk -F: '/^used_cpu_(sys|user):/{s+=$2} END{printf "%.6f", s}'
}

# redis_each ARGS... runs a redis-cli command on every node (RPORTS, else RPORT).
redis_each() {
  local p
  for p in ${RPORTS:-$RPORT}; do redis-cli -p "$p" "$@" >/dev/null; done
}

# start_redis starts a throwaway Redis on a free port into RPORT (no persistence).
start_redis() {
  RPORT=$(free_port)
  redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$BIN" --logfile "$BIN/redis.log" &
  PIDS+=($!)
  wait_port "$RPORT"
}

# start_cluster N starts an N-primary Redis Cluster (no replicas, no persistence) on free ports
# into RPORTS, with RPORT its first node and RADDRS its seed list (comma-separated).
start_cluster() {
  local i p addrs=()
  RPORTS=""
  for i in $(seq 1 "$1"); do
    p=$(free_port)
    # The cluster bus listens on p+10000: pick again when it is taken.
    while (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; do p=$(free_port); done
    mkdir -p "$BIN/node$p"
    redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$BIN/node$p" \
      --logfile "$BIN/node$p/redis.log" --cluster-enabled yes --cluster-config-file nodes.conf &
    PIDS+=($!)
    wait_port "$p"
    RPORTS="$RPORTS $p"
    addrs+=("127.0.0.1:$p")
  done
  RPORT=${RPORTS# }
  RPORT=${RPORT%% *}
  RADDRS=$(IFS=,; echo "${addrs[*]}")
  redis-cli --cluster create "${addrs[@]}" --cluster-yes >"$BIN/cluster-create.log"
  for _ in $(seq 1 300); do
    redis-cli -p "$RPORT" cluster info | grep -q 'cluster_state:ok' && return 0
    sleep 0.1
  done
  echo "bench: the cluster never came up" >&2
  return 1
}

# build_load builds the shared bench's RLS load generator and no-op server into BIN.
build_load() {
  (cd "$BENCH/noop-rls" && go build -o "$BIN/noop-rls" .)
  (cd "$BENCH/rlsload" && go build -o "$BIN/rlsload" .)
}

# rlsload ADDR DESCRIPTORS SECONDS prints the load generator's last line: c=50, one
# connection, 100K users, as every figure in docs/measurements.md.
rlsload() { "$BIN/rlsload" -addr "$1" -c 50 -conns 1 -d "${3}s" -keys 100000 -descriptors "$2" | tail -n 1; }

# load_calls and load_rate read the calls made and the calls per second from rlsload's line.
load_calls() { echo "$1" | sed -n 's/^calls \([0-9]*\).*/\1/p'; }
load_rate() { echo "$1" | sed -n 's/.*: \([0-9.]*\)\/s.*/\1/p'; }
