#!/usr/bin/env bash
# netns_elastic_test.sh — a host joins a running nexar job formed from torchrun's variables,
# across "hosts" made of network namespaces.
#
#   tests/netns_elastic_test.sh [BUILD_DIR]    (default: build; needs BUILD_DIR/bin/nexar-cluster-check)
#
# Builds (tests/netns_lib.sh) a switch namespace with a bridge and 5 host namespaces on one
# IPv4 subnet, with rps_cpus set on every link, and checks the plumbing with a UDP echo
# between every pair of hosts. Then:
#
#  (a) refusal: in host 0, nexar-cluster-check as torchrun's rank 0 (MASTER_ADDR, MASTER_PORT,
#      RANK=0, WORLD_SIZE=4, TORCHELASTIC_RUN_ID=none) with NEXAR_ELASTIC=1 and no
#      NEXAR_CLUSTER_TOKEN must exit 1 at once, saying that the token derived from the job id
#      is refused and naming NEXAR_CLUSTER_TOKEN (an elastic seed admits nodes for the whole
#      job: a guessable token would let anyone in).
#  (b) grow: hosts 0..3 run nexar-cluster-check --quick --grow 1 as torchrun's ranks 0..3
#      (MASTER_ADDR = host 0's address, MASTER_PORT, RANK, WORLD_SIZE=4, NEXAR_ELASTIC=1,
#      NEXAR_CLUSTER_TOKEN): rank 0 runs the embedded, elastic seed. Once that seed says the
#      4 formed, host 4 runs nexar-cluster-check --quick --grow 1 with only
#      NEXAR_SEED_ADDR=<host 0>:MASTER_PORT and the token: the seed admits it into the running
#      job under the address it came from (host 4's), the members grow() it in as rank 4,
#      and all five run the battery on the world of 5. Passes when all five exit 0 and report
#      "rank R/5: N checks passed", ranks 0..4 once each, host 4 holding rank 4, and the
#      seed admitted host 4 from host 4's address.
#
# With NETNS_EXPECT_LINK set (e.g. tcp, beside NEXAR_LINK=tcp), every process also runs
# --links, and (b) passes only if every rank names that link for each of its peers (all on
# other hosts), the joiner's pairs included.
#
# Exit status: 0 pass, 1 fail, 77 skipped (not root, or no network namespaces here).
# Everything it creates (namespaces, veths, the bridge, temporary files, processes) is
# removed on exit, on failure and on Ctrl-C.
#
# Environment: NETNS_SUBNET4 (default 10.77.0), NETNS_TIMEOUT (seconds per process, default
# 60), NETNS_PORT (MASTER_PORT, default 29500), NETNS_CHECK_ARGS (default --quick).
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"

export NETNS_IPV6=0
# shellcheck source=tests/netns_lib.sh
source "$here/netns_lib.sh"

members=4
world=$((members + 1))
joiner_host=$members
port=${NETNS_PORT:-29500}
limit=${NETNS_TIMEOUT:-60}
read -r -a check_args <<<"${NETNS_CHECK_ARGS:---quick}"
expect_link=${NETNS_EXPECT_LINK:-}
[ -n "$expect_link" ] && check_args+=(--links)
token="netns-elastic-$$-$RANDOM$RANDOM"

if ! why=$(netns_check); then
  echo "netns elastic test skipped: needs root and ip netns ($why)"
  exit 77
fi
if [ ! -x "$bin/nexar-cluster-check" ]; then
  echo "netns elastic test: FAIL: $bin/nexar-cluster-check not found (build it first)"
  exit 1
fi

# Do not let the caller's environment pick a seed, rank or launcher for the processes.
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE NEXAR_BIND_ADDR NEXAR_ADVERTISE_ADDR NEXAR_SOCKET_IFNAME \
  NEXAR_ELASTIC NEXAR_SEED_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT \
  TORCHELASTIC_RUN_ID OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE PMIX_RANK \
  SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_STEP_NODELIST

netns_guard "netns elastic test" nexar-netns-elastic-test

netns_cleanup_stale
if ! netns_setup "$world"; then
  echo "netns elastic test: FAIL: could not build the namespaces"
  exit 1
fi
echo "netns elastic test: hosts ${NETNS_HOST[*]} (${NETNS_ADDR4[*]}); torchrun ranks in hosts 0..$((members - 1))," \
  "the joiner in host $joiner_host"
# shellcheck disable=SC2119  # the default port
if ! netns_probe; then
  echo "netns elastic test: FAIL: the namespaces cannot reach each other over UDP"
  exit 1
fi

show_log() { sed 's/^/     /' "$1" | tail -n "${2:-30}"; }
why() { [ "$1" = 124 ] || [ "$1" = 137 ] && echo " (timed out after $limit s)"; }
master=${NETNS_ADDR4[0]}
status=0
t_start=$(date +%s%N)
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# ---- (a) NEXAR_ELASTIC=1 with torchrun's derived token is refused --------------------------
part_a() {
  local log="$tmp/refuse.log" rc
  echo "== (a) NEXAR_ELASTIC=1, torchrun rank 0 with no NEXAR_CLUSTER_TOKEN (TORCHELASTIC_RUN_ID=none)"
  ip netns exec "${NETNS_HOST[0]}" env MASTER_ADDR="$master" MASTER_PORT="$port" RANK=0 WORLD_SIZE="$members" \
    TORCHELASTIC_RUN_ID=none NEXAR_ELASTIC=1 timeout -k 5 10 "$bin/nexar-cluster-check" "${check_args[@]}" \
    --grow 1 >"$log" 2>&1 </dev/null
  rc=$?
  if [ "$rc" = 1 ] && grep -q 'NEXAR_ELASTIC' "$log" && grep -q 'NEXAR_CLUSTER_TOKEN' "$log" &&
    grep -q 'refused' "$log"; then
    echo "   exit 1: $(grep -o 'NEXAR_ELASTIC=1 keeps.*' "$log" | cut -c1-160)..."
    echo "(a) PASS"
    return 0
  fi
  echo "   exit $rc$(why "$rc"); expected 1 and a refusal naming NEXAR_CLUSTER_TOKEN; output:"
  show_log "$log"
  echo "(a) FAIL"
  return 1
}

# ---- (b) a fifth host joins the running job ---------------------------------------------------
part_b() {
  local r rc line ok=0 wp=() t0 peers on pair
  echo "== (b) hosts 0..$((members - 1)): torchrun ranks (MASTER_ADDR=$master MASTER_PORT=$port WORLD_SIZE=$members" \
    "NEXAR_ELASTIC=1 NEXAR_CLUSTER_TOKEN=...) of nexar-cluster-check ${check_args[*]} --grow 1;" \
    "host $joiner_host: NEXAR_SEED_ADDR=$master:$port, the same program"
  t0=$(date +%s%N)
  # Started with ip netns exec directly (not through a function) so that $! is the process
  # itself (ip execs env, env execs timeout), which a kill reaches.
  for ((r = 0; r < members; r++)); do
    ip netns exec "${NETNS_HOST[r]}" env MASTER_ADDR="$master" MASTER_PORT="$port" RANK="$r" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      WORLD_SIZE="$members" TORCHELASTIC_RUN_ID=none NEXAR_ELASTIC=1 NEXAR_CLUSTER_TOKEN="$token" \
      NEXAR_DEBUG=info timeout -k 5 "$limit" "$bin/nexar-cluster-check" "${check_args[@]}" --grow 1 \
      >"$tmp/host$r.log" 2>&1 </dev/null &
    wp[r]=$!
    bg_pids+=("${wp[r]}")
  done
  # The joiner comes once rank 0's seed has formed the job: it joins the running job.
  script_wait "$limit" "${wp[0]}" grep -q 'seed: cluster .* formed with' "$tmp/host0.log"
  if ! grep -q "seed: cluster .* formed with $members ranks" "$tmp/host0.log"; then
    echo "   rank 0's embedded seed did not report formation with $members ranks"
    for ((r = 0; r < members; r++)); do echo "   host $r:"; show_log "$tmp/host$r.log" 20; done
    echo "(b) FAIL"
    return 1
  fi
  echo "   formed after $(ms_since "$t0") ms; starting the joiner in host $joiner_host (${NETNS_ADDR4[joiner_host]})"
  ip netns exec "${NETNS_HOST[joiner_host]}" env NEXAR_SEED_ADDR="$master:$port" NEXAR_CLUSTER_TOKEN="$token" \
    NEXAR_DEBUG=info timeout -k 5 "$limit" "$bin/nexar-cluster-check" "${check_args[@]}" --grow 1 \
    >"$tmp/host$joiner_host.log" 2>&1 </dev/null &
  wp[joiner_host]=$!
  bg_pids+=("${wp[joiner_host]}")

  for ((r = 0; r < world; r++)); do
    wait "${wp[r]}"
    rc=$?
    line=$(grep -E '^rank [0-9]+/[0-9]+:' "$tmp/host$r.log" | tail -n 1)
    if [ "$rc" = 0 ] && [[ "$line" =~ ^rank\ [0-9]+/$world:\ [0-9]+\ checks\ passed$ ]]; then
      echo "   host $r (${NETNS_ADDR4[r]}): $line$(sed -nE 's/^rank [0-9]+: (grew from .*)/ (\1)/p' "$tmp/host$r.log")"
    else
      echo "   host $r (${NETNS_ADDR4[r]}): exit $rc$(why "$rc"); ${line:-no summary line}; output:"
      show_log "$tmp/host$r.log"
      ok=1
    fi
  done
  if [ "$ok" = 0 ]; then
    local got want
    got=$(cat "$tmp"/host*.log | sed -nE 's/^rank ([0-9]+)\/[0-9]+:.*/\1/p' | sort -n | tr '\n' ' ')
    want="$(seq -s ' ' 0 $((world - 1))) "
    if [ "$got" != "$want" ]; then
      echo "   ranks reported: $got; expected each of 0..$((world - 1)) once"
      ok=1
    fi
    # torchrun's ranks are kept; the joiner is appended.
    for ((r = 0; r < world; r++)); do
      if ! grep -qE "^rank $r/$world:" "$tmp/host$r.log"; then
        echo "   host $r did not hold rank $r"
        ok=1
      fi
    done
    # Every pair ends up on the expected link (NETNS_EXPECT_LINK), the joiner's included.
    if [ -n "$expect_link" ]; then
      for ((r = 0; r < world; r++)); do
        line=$(grep -E "^rank $r: links:" "$tmp/host$r.log")
        peers=0 on=0
        # One pair a line: a link's name may hold a space ("quic-stripes x3").
        while read -r pair; do
          [ -n "$pair" ] || continue
          peers=$((peers + 1))
          [[ "+${pair#*=}+" == *"+$expect_link+"* ]] && on=$((on + 1))
        done < <(sed -E 's/ ([0-9]+)=/\n\1=/g' <<<"${line#*links:}")
        if [ "$peers" != $((world - 1)) ] || [ "$on" != "$peers" ]; then
          echo "   host $r: $on of $peers peers on $expect_link, expected all $((world - 1)): ${line:-no links line}"
          ok=1
        else
          echo "   host $r: every peer on $expect_link (${line#*links: })"
        fi
      done
    fi
    # The seed took the joiner's address from where it came: host 4, dialable by the members.
    if ! grep -qE "seed: admitted .*\(${NETNS_ADDR4[joiner_host]//./\\.}:[0-9]+.* into the running job as world rank $members" \
      "$tmp/host0.log"; then
      echo "   rank 0's seed did not admit ${NETNS_ADDR4[joiner_host]} as world rank $members; its log:"
      grep 'seed:' "$tmp/host0.log" | sed 's/^/     /'
      ok=1
    fi
  fi
  echo "   took $(ms_since "$t0") ms"
  if [ "$ok" = 0 ]; then echo "(b) PASS"; else echo "(b) FAIL"; fi
  return $ok
}

part_a || status=1
part_b || status=1
echo "netns elastic test: $(ms_since "$t_start") ms after the namespaces were up"
if [ "$status" = 0 ]; then echo "netns elastic test: PASS"; else echo "netns elastic test: FAIL"; fi
exit $status
