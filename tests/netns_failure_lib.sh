# shellcheck shell=bash
# shellcheck disable=SC2154  # $tmp and $bin come from the caller
# netns_failure_lib.sh — runs of examples/resilient_loop across network-namespace "hosts",
# with a fault injected into one of them, for tests/netns_failure_test.sh and
# bench/failure_recovery.sh. Source it after tests/script_lib.sh (which sets $bin) and
# tests/netns_lib.sh, once netns_setup and netns_guard ran ($tmp and bg_pids exist).
#
# Layout of a run (as tests/netns_test.sh): host 0 runs nexar-seed, hosts 1..W one rank each
# (NEXAR_RANK = host - 1, NEXAR_WORLD_SIZE = W, the seed's environment file), so rank r lives
# in host r + 1. A run's files are in $tmp/<label>/: seed.log, rank<r>.log (stdout and stderr
# of rank r), rank<r>.report (its --report lines), pids/rank<r>.pid (written by the program
# once joined).
#
# Functions:
#   nf_start LABEL W [ARGS...]   starts the seed and W ranks of `resilient_loop ARGS`; returns
#                                0 once every rank has joined (written its pid file), 1 if
#                                not within NF_LIMIT seconds (it says why on stderr)
#   nf_fault kill|silent R       injects the fault into rank R's process or host; prints the
#                                CLOCK_REALTIME ns of the fault on stdout
#                                  kill:   SIGKILL of the process (its port then answers
#                                          with ICMP unreachable)
#                                  silent: iptables DROP of every packet out of and into its
#                                          namespace (nothing answers, no ICMP); the time is
#                                          taken once the OUTPUT rule is in place
#   nf_wait R                    waits for rank R; its exit status in NF_RC[R]
#   nf_stop R                    kills rank R's process (and its `timeout`), e.g. the silent one
#   nf_unsilence R               removes the DROP rules from rank R's host
#   nf_field FILE KEY            the values of KEY=... in FILE's resilient_loop_event lines
#
# Settings: NF_LIMIT (seconds a process may run, default 120), NF_PORT (seed port, default
# 29400).

NF_LIMIT=${NF_LIMIT:-120}
NF_PORT=${NF_PORT:-29400}
NF_DIR=
NF_SEED=
NF_PIDS=()
# shellcheck disable=SC2034  # read by the callers
NF_RC=()

# nf_start LABEL W [ARGS...]
nf_start() {
  local label=$1 world=$2 t r vars=()
  shift 2
  NF_DIR="$tmp/$label"
  NF_PIDS=()
  NF_RC=()
  rm -rf "$NF_DIR"
  mkdir -p "$NF_DIR/pids"
  # Started with ip netns exec directly (not through a function) so that $! is the process
  # itself (ip execs timeout), which a kill reaches.
  ip netns exec "${NETNS_HOST[0]}" timeout -k 5 "$NF_LIMIT" "$bin/nexar-seed" \
    --listen "${NETNS_ADDR4[0]}:$NF_PORT" -n "$world" --env-file "$NF_DIR/env" \
    --formation-timeout-ms $((NF_LIMIT * 1000 / 2)) >"$NF_DIR/seed.log" 2>&1 </dev/null &
  NF_SEED=$!
  bg_pids+=("$NF_SEED")
  if ! script_wait 10 "$NF_SEED" script_seed_env "$NF_DIR/env"; then
    echo "$label: nexar-seed wrote no env file within 10 s; its output:" >&2
    sed 's/^/  seed: /' "$NF_DIR/seed.log" >&2
    return 1
  fi
  mapfile -t vars < <(grep -E '^NEXAR_[A-Z0-9_]+=' "$NF_DIR/env")
  for ((r = 0; r < world; r++)); do
    ip netns exec "${NETNS_HOST[r + 1]}" env "${vars[@]}" NEXAR_RANK="$r" NEXAR_WORLD_SIZE="$world" \
      timeout -k 5 "$NF_LIMIT" "$bin/resilient_loop" "$@" --report "$NF_DIR/rank$r.report" \
      --pid-dir "$NF_DIR/pids" >"$NF_DIR/rank$r.log" 2>&1 </dev/null &
    NF_PIDS[r]=$!
    bg_pids+=("${NF_PIDS[r]}")
  done
  for ((t = 0; t < NF_LIMIT * 10; t++)); do
    script_pid_files_at_least "$NF_DIR/pids" "$world" && return 0
    for ((r = 0; r < world; r++)); do
      if ! kill -0 "${NF_PIDS[r]}" 2>/dev/null; then
        echo "$label: rank $r exited before every rank joined; its output:" >&2
        sed 's/^/  /' "$NF_DIR/rank$r.log" | tail -n 20 >&2
        return 1
      fi
    done
    sleep 0.1
  done
  echo "$label: the ranks did not all join within $NF_LIMIT s" >&2
  return 1
}

# nf_fault kill|silent R
nf_fault() {
  local kind=$1 r=$2 pid
  case "$kind" in
    kill)
      pid=$(cat "$NF_DIR/pids/rank$r.pid") || return 1
      kill -9 "$pid" || return 1
      date +%s%N
      ;;
    silent)
      # OUTPUT first: the peers stop hearing from it from that moment on.
      ip netns exec "${NETNS_HOST[r + 1]}" sh -c \
        'iptables -w -A OUTPUT -j DROP && date +%s%N && iptables -w -A INPUT -j DROP'
      ;;
    *)
      echo "nf_fault: unknown fault '$kind'" >&2
      return 2
      ;;
  esac
}

# nf_wait R
nf_wait() {
  # (Without the redirection bash reports a rank killed by a signal on stderr.)
  wait "${NF_PIDS[$1]}" 2>/dev/null
  # shellcheck disable=SC2034  # read by the callers
  NF_RC[$1]=$?
}

# nf_stop R
nf_stop() {
  local r=$1 pid
  pid=$(cat "$NF_DIR/pids/rank$r.pid" 2>/dev/null) && kill -9 "$pid" 2>/dev/null
  kill "${NF_PIDS[r]}" 2>/dev/null
  nf_wait "$r"
}

# nf_unsilence R
nf_unsilence() {
  ip netns exec "${NETNS_HOST[$1 + 1]}" sh -c 'iptables -w -F INPUT && iptables -w -F OUTPUT'
}

# nf_field FILE KEY
nf_field() {
  sed -nE "s/^resilient_loop_event .*[ ]$2=([^ ]+).*/\1/p" "$1" 2>/dev/null
}

# nf_preflight NAME FAIL_STATUS: exits 77 (skipped) without root, namespaces or iptables, and
# FAIL_STATUS when nexar-seed or resilient_loop is not built; then clears every variable
# that would let the caller's environment pick a seed, rank, launcher or policy for the ranks.
nf_preflight() {
  local name=$1 fail=$2 why exe
  if ! why=$(netns_check); then
    echo "$name: skipped: needs root and ip netns ($why)"
    exit 77
  fi
  if ! command -v iptables >/dev/null 2>&1; then
    echo "$name: skipped: no iptables"
    exit 77
  fi
  for exe in nexar-seed resilient_loop; do
    [ -x "$bin/$exe" ] || { echo "$name: FAIL: $bin/$exe not found (build it first)"; exit "$fail"; }
  done
  unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
    NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME \
    RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
    PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST \
    NEXAR_ON_FAILURE
}
