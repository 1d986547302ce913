# shellcheck shell=bash
# netns_bench_lib.sh — what the network-namespace benchmarks share (after tests/netns_lib.sh,
# netns_setup and netns_guard): one nexar-bench (or gloo_bench) sweep with a seed in host 0
# and per_host ranks in each of hosts 1..workers/per_host, and the rows of an nccl-tests table.
#
# The caller sets: rate (tbf's rate, e.g. 1gbit), workers (the number of ranks), per_host
# (ranks per host, default 1; rank r runs on host 1 + r / per_host), port (the seed's), limit
# (seconds per run), out (log directory),
# bench_args (an array: nexar-bench's arguments after the collective), and coll (the
# collective, default all_reduce). Optionally relay_ms: a delay in ms (empty: none) that
# nexar-relay adds in front of every rank (relays_start), and relay_port (default 29600).

# bench_hosts NAME: the hosts of a benchmark called NAME: exits 77 (skipped) without root and
# namespaces; sets link_gbs (the link rate RATE in GB/s) and out (OUT, or a new directory
# /tmp/nexar-NAME.XXXXXX, kept); builds the switch and workers / per_host + 1 hosts with links shaped at
# RATE (netns_guard removes them on exit) and checks that they reach each other.
bench_hosts() {
  local name=$1 why rate_bits
  if ! why=$(netns_check); then
    echo "$name: skipped: needs root and ip netns ($why)"
    exit 77
  fi
  rate_bits=$(netns_rate_bits "$rate") || exit 2
  link_gbs=$(awk -v b="$rate_bits" 'BEGIN { printf "%.4g", b / 8 / 1e9 }')
  script_need "$name" nexar-seed nexar-bench
  out=${OUT:-$(mktemp -d "/tmp/nexar-${name//_/-}.XXXXXX")}
  mkdir -p "$out"
  netns_guard "$name" "nexar-${name//_/-}-tmp"
  netns_cleanup_stale
  netns_setup $((workers / ${per_host:-1} + 1)) "$rate" || { echo "$name: could not build the namespaces"; exit 1; }
  # shellcheck disable=SC2119  # the default port
  netns_probe || { echo "$name: the namespaces cannot reach each other"; exit 1; }
}

# host_of I: the host of rank I - 1.
host_of() { echo $((1 + ($1 - 1) / ${per_host:-1})); }

# rank_log LABEL I: where rank I - 1 writes: rank 0 in $out/LABEL.log, rank r in
# $out/LABEL.rankR.log.
rank_log() { if [ "$2" = 1 ]; then echo "$out/$1.log"; else echo "$out/$1.rank$(($2 - 1)).log"; fi; }

# wait_ranks LABEL: waits for the processes ${pids[1..workers]} (the caller's array, pids[I]
# is rank I - 1) and says which exited non-zero; returns 1 if any did.
wait_ranks() {
  local i rc status=0
  for ((i = 1; i <= workers; i++)); do
    wait "${pids[i]}"
    rc=$?
    [ "$rc" = 0 ] || { echo "# $1: rank $((i - 1)) exited $rc" >&2; status=1; }
  done
  return $status
}

# relays_start LABEL: with relay_ms set, starts nexar-relay on every rank's host I, listening
# on its address at relay_port and relaying to relay_port + 1 with relay_ms of delay each way
# ($out/LABEL.relayR.log for rank R), and waits until each listens; relay_env then gives the
# rank the variables that put the relay in front of it. Peers dial the relay (the advertised
# address); the rank's own sends go out directly, so a pair's connection passes one relay, the
# dialled rank's, and its round trip is 2 x relay_ms. Does nothing without relay_ms.
relays_start() {
  local label=$1 i a p=${relay_port:-29600} log
  relay_pids=()
  [ -n "${relay_ms:-}" ] || return 0
  [ "${per_host:-1}" = 1 ] || { echo "# $label: relays need one rank per host" >&2; return 1; }
  for ((i = 1; i <= workers; i++)); do
    a=${NETNS_ADDR4[i]}
    log="$out/$label.relay$((i - 1)).log"
    ip netns exec "${NETNS_HOST[i]}" "$bin/nexar-relay" --listen "$a:$p" --target "$a:$((p + 1))" \
      --delay-ms "$relay_ms" >"$log" 2>&1 </dev/null &
    relay_pids[i]=$!
    bg_pids+=("${relay_pids[i]}")
    script_wait 10 "${relay_pids[i]}" grep -q '^nexar-relay: .* -> ' "$log" ||
      { echo "# $label: nexar-relay on host $i did not start; see $log" >&2; return 1; }
  done
}

# relay_env I: the variables of host I's rank while relays run (bind relay_port + 1, advertise
# the relay); nothing without relay_ms.
relay_env() {
  [ -n "${relay_ms:-}" ] || return 0
  local a=${NETNS_ADDR4[$1]} p=${relay_port:-29600}
  echo "NEXAR_BIND_ADDR=$a:$((p + 1)) NEXAR_ADVERTISE_ADDR=$a:$p"
}

# relays_stop LABEL: stops the relays (SIGTERM: each writes what it relayed and dropped to its
# log) and says which did not exit 0; returns 1 if any.
relays_stop() {
  local i status=0
  for i in "${!relay_pids[@]}"; do
    kill "${relay_pids[i]}" 2>/dev/null
    wait "${relay_pids[i]}" ||
      { echo "# $1: nexar-relay on host $i exited $? (see $out/$1.relay$((i - 1)).log)" >&2; status=1; }
  done
  relay_pids=()
  return $status
}

# run_nexar LABEL [VAR=VALUE...]: one sweep; rank 0's output in $out/LABEL.log. With relay_ms,
# through a relay in front of every rank (relays_start).
run_nexar() {
  local label=$1 envf="$tmp/$1.env" seed t i status=0 vars=() pids=() relay_vars=()
  shift
  rm -f "$envf"
  ip netns exec "${NETNS_HOST[0]}" timeout -k 5 "$limit" "$bin/nexar-seed" \
    --listen "${NETNS_ADDR4[0]}:$port" -n "$workers" --env-file "$envf" \
    --formation-timeout-ms 60000 >"$out/$label.seed.log" 2>&1 &
  seed=$!
  bg_pids+=("$seed")
  for ((t = 0; t < 100; t++)); do
    grep -q '^NEXAR_SEED_ADDR=' "$envf" 2>/dev/null && grep -q '^NEXAR_CLUSTER_TOKEN' "$envf" && break
    kill -0 "$seed" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^NEXAR_SEED_ADDR=' "$envf" 2>/dev/null; then
    echo "# $label: nexar-seed wrote no env file; see $out/$label.seed.log" >&2
    return 1
  fi
  sleep 0.1
  mapfile -t vars < <(grep -E '^NEXAR_[A-Z0-9_]+=' "$envf")
  echo "\$ nexar-bench ${coll:-all_reduce} ${bench_args[*]}  (${per_host:-1} rank(s) per host${*:+; $*}${relay_ms:+; relay $relay_ms ms each way})" \
    >"$out/$label.log"
  relays_start "$label" || { relays_stop "$label"; kill "$seed" 2>/dev/null; wait "$seed"; return 1; }
  for ((i = 1; i <= workers; i++)); do
    read -r -a relay_vars <<<"$(relay_env "$i")"
    ip netns exec "${NETNS_HOST[$(host_of "$i")]}" env "${vars[@]}" "$@" "${relay_vars[@]}" NEXAR_RANK=$((i - 1)) \
      NEXAR_WORLD_SIZE="$workers" timeout -k 5 "$limit" "$bin/nexar-bench" "${coll:-all_reduce}" "${bench_args[@]}" \
      >>"$(rank_log "$label" "$i")" 2>&1 </dev/null &
    pids[i]=$!
    bg_pids+=("${pids[i]}")
  done
  wait_ranks "$label" || status=1
  wait "$seed" || { echo "# $label: nexar-seed exited $? (see $out/$label.seed.log)" >&2; status=1; }
  relays_stop "$label" || status=1
  return $status
}

# run_gloo LABEL: one gloo_bench sweep of $gloo_bin (ring, TCP, FileStore rendezvous in a
# directory every namespace sees), rank r on host 1 + r / per_host; rank 0's output in
# $out/LABEL.log.
run_gloo() {
  local label=$1 store="$tmp/$1.store" i h pids=()
  rm -rf "$store"
  mkdir -p "$store"
  echo "\$ gloo_bench all_reduce ${bench_args[*]}  (${per_host:-1} rank(s) per host)" >"$out/$label.log"
  for ((i = 1; i <= workers; i++)); do
    h=$(host_of "$i")
    netns_exec "$h" timeout -k 5 "$limit" "$gloo_bin" --rank $((i - 1)) --size "$workers" \
      --store-dir "$store" --host "${NETNS_ADDR4[h]}" all_reduce "${bench_args[@]}" \
      >>"$(rank_log "$label" "$i")" 2>&1 </dev/null &
    pids[i]=$!
    bg_pids+=("${pids[i]}")
  done
  wait_ranks "$label"
}

# Data rows of an nccl-tests table as "size busbw wrong time", busbw recomputed from the time
# column (us) with more digits than the table's 2 decimals: size / time x 2(n-1)/n.
rows() {
  awk -v n="$workers" '$1 ~ /^[0-9]+$/ && NF >= 9 && $6 + 0 > 0 {
      printf "%s %.4f %s %s\n", $1, $1 / ($6 * 1e3) * 2 * (n - 1) / n, $9, $6 }' "$1" 2>/dev/null
}

