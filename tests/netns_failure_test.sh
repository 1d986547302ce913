#!/usr/bin/env bash
# netns_failure_test.sh — a host of a nexar cluster goes silent mid-run; the others notice
# within the failure timeout, drop it and finish correctly.
#
#   tests/netns_failure_test.sh [BUILD_DIR]    (default: build; needs BUILD_DIR/bin/nexar-seed
#                                               and BUILD_DIR/bin/resilient_loop)
#
# Builds (tests/netns_lib.sh) a switch namespace with a bridge and 5 host namespaces: host 0
# runs nexar-seed, hosts 1..4 one rank each of
#     resilient_loop --steps 300 --step-ms 20 --report FILE
# (the automatic failure policy; rank r in host r + 1, tests/netns_failure_lib.sh). About 2 s
# after every rank joined (step 100), rank 2's host goes silent: iptables DROP of everything
# out of and into its namespace, so the others get no answer at all, not even ICMP. Passes
# when
#   * the three survivors exit 0 and the lowest prints "resilient_loop: steps=300 world=3
#     failures=1 wrong=0",
#   * each survivor's --report line shows its operation failed (rank_failed) within the
#     failure timeout (NEXAR_FAILURE_TIMEOUT_MS, default 3000) + 500 ms of the drop.
# The silent rank's process is killed afterwards.
#
# Exit status: 0 pass, 1 fail, 77 skipped (not root, or no network namespaces here).
# Everything it creates is removed on exit, on failure and on Ctrl-C.
#
# Environment: NETNS_SUBNET4 (default 10.77.0), NETNS_TIMEOUT (seconds per process, default
# 60), NETNS_PORT (seed port, default 29400), NEXAR_FAILURE_TIMEOUT_MS (passed on to the ranks).
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh" "${1:-build}"

export NETNS_IPV6=0
# shellcheck source=tests/netns_lib.sh
source "$here/netns_lib.sh"
# shellcheck source=tests/netns_failure_lib.sh
source "$here/netns_failure_lib.sh"

world=4
victim=2
steps=300
NF_LIMIT=${NETNS_TIMEOUT:-60}
NF_PORT=${NETNS_PORT:-29400}
failure_timeout_ms=${NEXAR_FAILURE_TIMEOUT_MS:-3000}
slack_ms=500

nf_preflight "netns failure test" 1

netns_guard "netns failure test" nexar-netns-failure-test

netns_cleanup_stale
if ! netns_setup $((world + 1)); then
  echo "netns failure test: FAIL: could not build the namespaces"
  exit 1
fi
echo "netns failure test: hosts ${NETNS_HOST[*]} (${NETNS_ADDR4[*]}); seed in host 0, rank r in host r+1"
# shellcheck disable=SC2119  # the default port
if ! netns_probe; then
  echo "netns failure test: FAIL: the namespaces cannot reach each other over UDP"
  exit 1
fi

echo "== resilient_loop --steps $steps --step-ms 20 on $world hosts; rank $victim's host" \
  "(${NETNS_ADDR4[victim + 1]}) goes silent at about step 100"
if ! nf_start silent "$world" --steps "$steps" --step-ms 20; then
  echo "netns failure test: FAIL"
  exit 1
fi
sleep 2
fault_ns=$(nf_fault silent "$victim")
if [ -z "$fault_ns" ]; then
  echo "netns failure test: FAIL: could not add the iptables DROP rules in ${NETNS_HOST[victim + 1]}"
  exit 1
fi
echo "   $(date -d "@${fault_ns:0:10}" +%T).${fault_ns:10:3}: iptables DROP in and out of ${NETNS_HOST[victim + 1]}"

status=0
limit_ms=$((failure_timeout_ms + slack_ms))
for ((r = 0; r < world; r++)); do
  [ "$r" = "$victim" ] && continue
  nf_wait "$r"
  rc=${NF_RC[r]}
  err_ns=$(nf_field "$NF_DIR/rank$r.report" error_ns | head -n 1)
  events=$(grep -c '^resilient_loop_event ' "$NF_DIR/rank$r.report" 2>/dev/null)
  size_after=$(nf_field "$NF_DIR/rank$r.report" size_after | head -n 1)
  summary=$(grep -E '^resilient_loop: ' "$NF_DIR/rank$r.log")
  line="   rank $r: exit $rc"
  [ -n "$summary" ] && line+="; \"$summary\""
  ok=1
  if [ -n "$err_ns" ]; then
    after_ms=$(((err_ns - fault_ns) / 1000000))
    line+="; its operation failed $after_ms ms after the drop (limit $limit_ms ms), $events event(s), then size ${size_after:-?}"
    if [ "$after_ms" -lt 0 ] || [ "$after_ms" -gt "$limit_ms" ] || [ "$events" != 1 ] || [ "$size_after" != 3 ]; then
      ok=0
    fi
  else
    line+="; no failure reported"
    ok=0
  fi
  [ "$rc" = 0 ] || ok=0
  echo "$line"
  if [ "$ok" = 0 ]; then
    echo "     its output:"
    sed 's/^/       /' "$NF_DIR/rank$r.log" | tail -n 30
    status=1
  fi
done
# The summary: exactly one, from the lowest survivor.
summaries=$(cat "$NF_DIR"/rank*.log | grep -c "^resilient_loop: steps=$steps world=3 failures=1 wrong=0\$")
first=0
[ "$victim" = 0 ] && first=1
if ! grep -qx "resilient_loop: steps=$steps world=3 failures=1 wrong=0" "$NF_DIR/rank$first.log" || [ "$summaries" != 1 ]; then
  echo "   expected \"resilient_loop: steps=$steps world=3 failures=1 wrong=0\" once, from rank $first"
  status=1
fi
nf_stop "$victim"
echo "   rank $victim (silent) killed afterwards; its last lines:"
tail -n 3 "$NF_DIR/rank$victim.log" | sed 's/^/     /'
if [ "$status" = 0 ]; then echo "netns failure test: PASS"; else echo "netns failure test: FAIL"; fi
exit $status
