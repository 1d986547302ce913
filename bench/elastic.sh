#!/usr/bin/env bash
# elastic.sh — how long it takes to admit ranks into a running job, and to replace a lost one.
#
#   bench/elastic.sh [-r REPEATS] [-n "4"] [BUILD_DIR]     (default: build)
#
# For each world size W (default 4: the 4 -> 8 row), two runs of examples/resilient_loop
# (--steps STEPS --step-ms STEP_MS --count COUNT --report F), all on this host:
#   grow:    nexar-seed --elastic -n W; one nexar-run --seed starts the W members with
#            --min-joiners W; WARM seconds after they all joined a second nexar-run --seed
#            starts W more, which join the running job. The members grow once every one of
#            them sees all W waiting, so the world goes from W to 2W in one grow().
#   restore: nexar-run -n W --max-restarts 1; WARM seconds after every rank joined, world rank
#            VICTIM (default W/2) gets SIGKILL; nexar-run starts it again and the loop admits it.
# Columns, in ms:
#   join_first  a joiner's process start (its main) -> its first completed all_reduce, in the
#               grow run: median over the W joiners
#   join_max    the same, for the slowest joiner
#   grow        the members' grow() that admitted the joiners: median over the W members
#   grow_max    the same, for the slowest member
#   restore     SIGKILL -> the end of the replacement's first all_reduce, in which it caught up
#               with the survivors: the world has W ranks again (detection, restart, join,
#               admission at the next step, catching up)
# With -r REPEATS each cell is the median of the repeats (runs: how many grow and restore runs
# succeeded, of REPEATS each); a run that fails (a process exits
# non-zero, or a report is missing) is reported and left out, and the exit status is then 1.
# The reports and logs of every run are in OUT.
#
# Environment: STEPS (default 600), STEP_MS (default 10), COUNT (default 1024), WARM
# (seconds, default 1), VICTIM (world rank to kill, default W/2), TIMEOUT (seconds per run,
# default 60), OUT (directory for the logs, default a new /tmp directory, kept).
#
# Every process runs on this host (2W at once in the grow run): run it on an otherwise idle
# machine with at least 2W CPUs for figures worth comparing.
set -uo pipefail

# shellcheck source=tests/script_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../tests/script_lib.sh" build
script_bench_opts elastic "4" "$@"

steps=${STEPS:-600}
step_ms=${STEP_MS:-10}
count=${COUNT:-1024}
warm=${WARM:-1}
limit=${TIMEOUT:-60}

script_need elastic nexar-run nexar-seed resilient_loop
script_tmp "elastic" nexar-elastic-bench
out=${OUT:-$(mktemp -d /tmp/nexar-elastic.XXXXXX)}
mkdir -p "$out"

# Do not let the caller's environment pick a seed, rank, launcher or policy for us.
unset NEXAR_SEED_ADDR NEXAR_CLUSTER_TOKEN NEXAR_CLUSTER_TOKEN_FILE NEXAR_SEED_FINGERPRINT \
  NEXAR_SEED_CA NEXAR_RANK NEXAR_WORLD_SIZE RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT \
  OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE PMIX_RANK SLURM_PROCID SLURM_NTASKS \
  SLURM_LOCALID SLURM_STEP_NODELIST NEXAR_ON_FAILURE NEXAR_RUN_ON_FAILURE NEXAR_ELASTIC

loop_args=(--steps "$steps" --step-ms "$step_ms" --count "$count")

# field KEY: the value of KEY=... on each line of stdin.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
# median / max of the numbers on stdin ("-" when none).
median() { script_median %.1f; }
maximum() { sort -g | awk 'END { if (NR == 0) printf "-"; else printf "%.1f", $1 }'; }

# grow_run W REP: appends "join_first join_max grow grow_max" to $out/wW.grow.
grow_run() {
  local w=$1 rep=$2 dir seed members joiners rc_m rc_j report row
  dir="$out/w$w-grow-$rep"
  mkdir -p "$dir/pids"
  report="$dir/report"
  NEXAR_CLUSTER_TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n') \
    timeout -k 5 "$limit" "$bin/nexar-seed" --listen 127.0.0.1:0 -n "$w" --elastic \
    --env-file "$dir/seed.env" >"$dir/seed.log" 2>&1 &
  seed=$!
  pids+=("$seed")
  if ! script_wait 10 "$seed" script_seed_env "$dir/seed.env"; then
    echo "# w$w grow $rep: nexar-seed did not start; see $dir/seed.log" >&2
    kill "$seed" 2>/dev/null
    return 1
  fi
  (
    set -a
    # shellcheck disable=SC1091
    . "$dir/seed.env"
    set +a
    exec timeout -k 5 "$limit" "$bin/nexar-run" -n "$w" --seed "$NEXAR_SEED_ADDR" --bind-to none \
      "$bin/resilient_loop" "${loop_args[@]}" --min-joiners "$w" --report "$report" --pid-dir "$dir/pids"
  ) >"$dir/members.log" 2>&1 &
  members=$!
  pids+=("$members")
  joiners=""
  if script_wait "$limit" "$members" script_pid_files_at_least "$dir/pids" "$w"; then
    sleep "$warm"
    (
      set -a
      # shellcheck disable=SC1091
      . "$dir/seed.env"
      set +a
      exec timeout -k 5 "$limit" "$bin/nexar-run" -n "$w" --seed "$NEXAR_SEED_ADDR" --bind-to none \
        "$bin/resilient_loop" "${loop_args[@]}" --report "$report"
    ) >"$dir/joiners.log" 2>&1 &
    joiners=$!
    pids+=("$joiners")
  fi
  wait "$members"
  rc_m=$?
  rc_j=none
  if [ -n "$joiners" ]; then
    wait "$joiners"
    rc_j=$?
  fi
  kill "$seed" 2>/dev/null
  wait "$seed" 2>/dev/null
  if [ "$rc_m" != 0 ] || [ "$rc_j" != 0 ]; then
    echo "# w$w grow $rep: the members' nexar-run exited $rc_m, the joiners' $rc_j; see $dir" >&2
    return 1
  fi
  if [ "$(grep -c '^resilient_loop_joined ' "$report")" != "$w" ] ||
    [ "$(grep '^resilient_loop_grow ' "$report" | grep -c " size_after=$((2 * w)) joined=$w ")" != "$w" ]; then
    echo "# w$w grow $rep: not every joiner was admitted in one grow of every member; see $report" >&2
    return 1
  fi
  row="$(grep '^resilient_loop_joined ' "$report" | field first_ms | median)"
  row+=" $(grep '^resilient_loop_joined ' "$report" | field first_ms | maximum)"
  row+=" $(grep '^resilient_loop_grow ' "$report" | grep " joined=$w " | field grow_ms | median)"
  row+=" $(grep '^resilient_loop_grow ' "$report" | grep " joined=$w " | field grow_ms | maximum)"
  echo "$row" >>"$out/w$w.grow"
  echo "# w$w grow $rep: $row" >&2
}

# restore_run W REP: appends "restore" to $out/wW.restore.
restore_run() {
  local w=$1 rep=$2 victim=${VICTIM:-$(($1 / 2))} dir run rc pid kill_at first report restore
  dir="$out/w$w-restore-$rep"
  mkdir -p "$dir/pids"
  report="$dir/report"
  timeout -k 5 "$limit" "$bin/nexar-run" -n "$w" --max-restarts 1 "$bin/resilient_loop" "${loop_args[@]}" \
    --report "$report" --pid-dir "$dir/pids" >"$dir/run.log" 2>&1 &
  run=$!
  pids+=("$run")
  kill_at=""
  if script_wait "$limit" "$run" script_pid_files_at_least "$dir/pids" "$w"; then
    sleep "$warm"
    if pid=$(cat "$dir/pids/rank$victim.pid" 2>/dev/null); then
      kill_at=$EPOCHREALTIME
      kill -9 "$pid" 2>/dev/null || kill_at=""
    fi
  fi
  wait "$run"
  rc=$?
  if [ -z "$kill_at" ] || [ "$rc" != 0 ]; then
    echo "# w$w restore $rep: nexar-run exited $rc$([ -z "$kill_at" ] && echo ", rank $victim not killed"); see $dir" >&2
    return 1
  fi
  first=$(grep '^resilient_loop_joined ' "$report" | field first_ns | head -n 1)
  if [ -z "$first" ]; then
    echo "# w$w restore $rep: the replacement never caught up; see $dir" >&2
    return 1
  fi
  restore=$(awk -v f="$first" -v k="$kill_at" 'BEGIN { printf "%.1f", (f - k * 1e9) / 1e6 }')
  echo "$restore" >>"$out/w$w.restore"
  echo "# w$w restore $rep: $restore" >&2
}

echo "# elastic: resilient_loop (automatic policy), $count float64 per all_reduce, step $step_ms ms," \
  "$repeats repeat(s), $(nproc) CPUs; logs in $out"
status=0
for w in $sizes; do
  : >"$out/w$w.grow"
  : >"$out/w$w.restore"
  for ((rep = 1; rep <= repeats; rep++)); do
    grow_run "$w" "$rep" || status=1
    restore_run "$w" "$rep" || status=1
  done
done

echo
printf "%8s %11s %9s %8s %9s %9s %10s\n" ranks join_first join_max grow grow_max restore runs
for w in $sizes; do
  g="$out/w$w.grow"
  cells=""
  for c in 1 2 3 4; do cells+=" $(awk -v c="$c" '{ print $c }' "$g" | median)"; done
  read -r jf jm gr gm <<<"$cells"
  printf "%8s %11s %9s %8s %9s %9s %10s\n" "$w->$((2 * w))" "$jf" "$jm" "$gr" "$gm" \
    "$(median <"$out/w$w.restore")" "$(grep -c '' "$g"),$(grep -c '' "$out/w$w.restore")/$repeats"
done
echo "# ms, median over runs: join_first/join_max = a joiner's start -> its first all_reduce done (median/slowest" \
  "joiner); grow/grow_max = the members' grow() (median/slowest); restore = SIGKILL -> the replacement's" \
  "first all_reduce done (--max-restarts); runs = grow runs,restore runs that succeeded / repeats"
exit $status
