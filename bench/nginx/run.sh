#!/usr/bin/env bash
# bench/nginx/run.sh - B5 and B6 (issue 5) in a private nginx against a
# private redis-server, both on free 127.0.0.1 ports, run dir build/bench/nginx,
# both always stopped (trap). `make bench-nginx` runs it; `make bench` too
# when nginx with the Lua module is installed. About 40 s.
#
# B5  per-operation cost of the full cycle through clientpool.ngx (acquire =
#     tcp() + connect(pool=), release = setkeepalive, plus the pool's own
#     work) over the bare tcp() + connect(pool=) + setkeepalive, in one
#     content handler, several rounds of N operations each, medians of the
#     per-round ratios. Target <= 1.3x (issue 17). A second run adds a PING to every
#     operation (a reference: what a request sees).
# B6  wrk (2 threads, 50 connections) against 2 nginx workers, every request
#     a PING to redis, through clientpool.ngx (max_live POOL_SIZE per worker),
#     OpenResty's pool_size alone and pool_size with backlog; each run in a
#     fresh nginx. A side process (bench/nginx/sample.lua, one connection of
#     its own) samples INFO clients every ~1 ms: the most connections redis
#     saw, and total_connections_received over the run / wrk's requests.
#     Target for clientpool: never more than 2 x max_live, <= 0.1% new
#     connections per request.
#     Then with 4 workers and one cap for all of them (FLEET_CAP, default
#     POOL_SIZE): clientpool.ngx on a fleet (clientpool.fleet made in
#     init_by_lua, max_live FLEET_CAP machine-wide), against OpenResty's
#     per-worker pool_size POOL_SIZE (no cap: 4 x POOL_SIZE) and pool_size
#     FLEET_CAP / 4 + backlog (the cap split by hand). Target for the
#     fleet: never more than FLEET_CAP connections.
#
# B2  (in nginx) contended handoff: 100 light threads of one request share
#     one client (max_live = 1) through the ngx scheduler, per handoff over
#     the same ring sharing one unit of an ngx.semaphore. Target <= 3x (issue 17).
#
# environment: B2_N (20000), B2_ROUNDS (15), B5_N (20000), B5_ROUNDS (15), B6_SECS (3), B6_ROUNDS (2),
# POOL_SIZE (10, per worker: max_live and pool_size), BACKLOG (100), FLEET_CAP (POOL_SIZE), NGINX,
# REDIS_SERVER, NGINX_MODULES (default /usr/lib/nginx/modules), B5_PROFILE=1
# (B5 and B2 only, no B6: LuaJIT's trace log and jit.p profiles of each form in
# build/bench/nginx/profile/).
# Rows are also written to build/bench/nginx.tsv.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
run=$root/build/bench/nginx
nginx_bin=${NGINX:-nginx}
redis_bin=${REDIS_SERVER:-redis-server}
B5_N=${B5_N:-20000}
B5_ROUNDS=${B5_ROUNDS:-15}
B5_PING_N=$((B5_N / 40 > 50 ? B5_N / 40 : 50))
B2_N=${B2_N:-20000}
B2_ROUNDS=${B2_ROUNDS:-15}
B6_SECS=${B6_SECS:-3}
B6_ROUNDS=${B6_ROUNDS:-2}
POOL_SIZE=${POOL_SIZE:-10}
BACKLOG=${BACKLOG:-100}
WORKERS=2
FLEET_CAP=${FLEET_CAP:-$POOL_SIZE}
FLEET_WORKERS=4

note() { echo "bench-nginx: $*" >&2; }
die() { note "$*"; exit 1; }

. "$root/scripts/servers.sh"
need_tools wrk

rm -rf "$run"
mkdir -p "$run/tmp" "$run/logs" || die "cannot make $run"

port=$(free_port); redis_port=$(free_port)
while [ "$redis_port" = "$port" ]; do redis_port=$(free_port); done
[ -n "$port" ] && [ -n "$redis_port" ] || die "cannot find free ports"

fleet_name="bench-nginx-fleet-$port-$$"
cleanup() {
  local rc=$?
  [ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null
  nginx_stop
  redis_stop
  luajit -e "package.cpath='$root/build/luajit/?.so;'..package.cpath
    require('clientpool.core').fleet.remove('$fleet_name')" 2>/dev/null
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- redis
redis_start "$redis_port"
rcli() { redis-cli -p "$redis_port" "$@" 2>/dev/null; }

# ---------------------------------------------------------------- nginx
split=$(( FLEET_CAP / FLEET_WORKERS > 0 ? FLEET_CAP / FLEET_WORKERS : 1 ))
lua_conf bench_conf redis_port="$redis_port" pool_size="$POOL_SIZE" backlog="$BACKLOG" \
  fleet="'$fleet_name'" fleet_cap="$FLEET_CAP" split="$split"

nginx_conf $WORKERS "$port" "$here" <<'EOF'
location = /b2 { content_by_lua_block { require("nginx_bench").b2() } }
location = /b5 { content_by_lua_block { require("nginx_bench").b5() } }
location = /b6/cp { content_by_lua_block { require("nginx_bench").b6_cp() } }
location = /b6/size { content_by_lua_block { require("nginx_bench").b6_size() } }
location = /b6/backlog { content_by_lua_block { require("nginx_bench").b6_backlog() } }
EOF

tsv=$root/build/bench/nginx.tsv
: >"$tsv"

rev=$(git -C "$root" describe --always --dirty 2>/dev/null)
echo "== clientpool bench in nginx${rev:+ ($rev)}: $("$nginx_bin" -v 2>&1 | sed 's/.*: //'), $WORKERS workers, redis $("$redis_bin" --version | sed 's/.* v=\([^ ]*\).*/\1/') on 127.0.0.1:$redis_port"

# ---------------------------------------------------------------- B5
nginx_start "$port"
prof_dir=$run/profile
if [ "${B5_PROFILE:-0}" = 1 ]; then
  mkdir -p "$prof_dir" && chmod 0777 "$prof_dir"   # nginx workers may run as nobody
fi
b5() {
  local out prof=
  if [ "${B5_PROFILE:-0}" = 1 ] && [ -z "${3:-}" ]; then
    prof="&profile=$prof_dir"
  fi
  out=$(curl -fs -m 300 "http://127.0.0.1:$port/b5?n=$1&rounds=$2${3:+&ping=1}$prof") ||
    { tail -20 "$run/error.log" >&2; die "B5 failed"; }
  echo "$out" >>"$run/logs/b5.log"
  echo "$out" | grep -v '^#' >>"$tsv"
}
# (a suite given 0 rounds is skipped: its target line then says "not run")
if [ "$B5_ROUNDS" -gt 0 ]; then
  b5 "$B5_N" "$B5_ROUNDS"
  b5 "$B5_PING_N" 9 ping
fi
if [ "$B2_ROUNDS" -gt 0 ]; then
  b2prof=
  [ "${B5_PROFILE:-0}" = 1 ] && b2prof="&profile=$prof_dir"
  out=$(curl -fs -m 300 "http://127.0.0.1:$port/b2?n=$B2_N&rounds=$B2_ROUNDS$b2prof") ||
    { tail -20 "$run/error.log" >&2; die "B2 failed"; }
  echo "$out" >>"$run/logs/b2.log"
  echo "$out" | grep -v '^#' >>"$tsv"
fi
nginx_stop
if [ "${B5_PROFILE:-0}" = 1 ]; then
  for f in bare lease checkout b2-sema b2-lease b2-checkout; do
    [ -f "$prof_dir/jitp-$f.txt" ] && { echo "== $prof_dir/jitp-$f.txt"; head -16 "$prof_dir/jitp-$f.txt"; }
  done
  [ -f "$prof_dir/diag.txt" ] && { echo "== diagnostics ($prof_dir/diag.txt)"; cat "$prof_dir/diag.txt"; }
  echo "== trace aborts (jit.v, $prof_dir/jitv*.txt)"
  cat "$prof_dir"/jitv*.txt 2>/dev/null | grep -- '--- ' | sed 's/^\[TRACE --- ([0-9\/a-z]*) //' | sort | uniq -c | sort -rn | head
  cat "$tsv"
  exit 0
fi

# ---------------------------------------------------------------- B6
b6_run() { # config round
  local cfg=$1 r=$2 log=$run/logs/b6-$1-$2 sample reqs rps errs non2xx max opened
  redis_quiet "$redis_port"
  nginx_start "$port"
  lua5.1 "$here/sample.lua" "$redis_port" "$(awk -v s="$B6_SECS" 'BEGIN { print s + 0.6 }')" >"$log.sample" 2>&1 &
  sampler=$!
  sleep 0.3
  wrk -t2 -c50 -d"${B6_SECS}s" "http://127.0.0.1:$port/b6/$cfg" >"$log.wrk" 2>&1
  wait "$sampler"; sampler=
  nginx_stop
  sample=$(cat "$log.sample")
  case $sample in max=*) ;; *) echo "$sample" >&2; die "B6 sampler failed ($cfg)";; esac
  reqs=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$log.wrk")
  [ -n "$reqs" ] || { cat "$log.wrk" >&2; die "B6 wrk failed ($cfg)"; }
  rps=$(sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' "$log.wrk")
  non2xx=$(sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$log.wrk")
  errs=$(sed -n 's/^ *Socket errors: \(.*\)/\1/p' "$log.wrk" |
         awk -F'[ ,]+' '{ s = 0; for (i = 2; i <= NF; i += 2) s += $i; print s }')
  max=$(echo "$sample" | sed 's/.*max=\([0-9]*\).*/\1/')
  opened=$(echo "$sample" | sed 's/.*opened=\([0-9]*\).*/\1/')
  printf 'B6.%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cfg" "$r" "$max" "$opened" "$reqs" "$rps" \
    "$(( ${non2xx:-0} + ${errs:-0} ))" >>"$tsv"
}
for r in $(seq 1 "$B6_ROUNDS"); do
  for cfg in cp size backlog; do b6_run "$cfg" "$r"; done
done
# ... with 4 workers and the fleet (made in init_by_lua): a second config
NGINX_HTTP_EXTRA='init_by_lua_block { require("nginx_bench").init() }' nginx_conf $FLEET_WORKERS "$port" "$here" <<'EOF'
location = /b6/fleet { content_by_lua_block { require("nginx_bench").b6_fleet() } }
location = /b6/size4 { content_by_lua_block { require("nginx_bench").b6_size() } }
location = /b6/split4 { content_by_lua_block { require("nginx_bench").b6_split() } }
EOF
for r in $(seq 1 "$B6_ROUNDS"); do
  for cfg in fleet size4 split4; do b6_run "$cfg" "$r"; done
done

# ---------------------------------------------------------------- tables
echo
echo "B2 in nginx: per handoff, $B2_ROUNDS rounds of $B2_N handoffs between 100 light threads of one request; medians of the per-round ratios"
echo
echo "| figure | | ratio | ns/handoff | semaphore ns/handoff |"
echo "|---|---|---:|---:|---:|"
awk -F'\t' '
  /^B2\.ngx\./ {
    if ($1 ~ /sched/) d = "(reference) the ngx scheduler adapter alone (current, wait, wake, done), no pool / ngx.semaphore wait+post"
    else d = "handoff, " ($1 ~ /checkout/ ? "checkout/checkin" : "acquire/release") " via the ngx scheduler / ngx.semaphore wait+post"
    printf "| %s | %s | %.2fx | %.0f ns | %.0f ns |\n", $1, d, $2, $3, $4
  }' "$tsv"
echo
echo "B5: per operation, medians of $B5_ROUNDS rounds of $B5_N (PING rows: 9 rounds of $B5_PING_N); ratio to the bare cycle of the same round"
echo
echo "| figure | | ratio | ns/op | bare ns/op |"
echo "|---|---|---:|---:|---:|"
awk -F'\t' '
  /^B5\./ {
    what = $1 ~ /checkout/ ? "checkout+checkin" : "acquire+release"
    d = $1 ~ /ping/ ? what " + PING / bare + PING (reference)" : what " via clientpool.ngx / bare tcp+connect(pool)+setkeepalive"
    printf "| %s | %s | %.2fx | %.0f ns | %.0f ns |\n", $1, d, $2, $3, $4
  }' "$tsv"
echo
echo "B6: wrk -t2 -c50 -d${B6_SECS}s, $WORKERS workers, one redis PING per request; $B6_ROUNDS runs each, a fresh nginx per run"
echo
echo "| figure | upstream connections per worker | most redis connections seen | new connections / request | requests/s | errors |"
echo "|---|---|---:|---:|---:|---:|"
awk -F'\t' -v ps="$POOL_SIZE" -v bl="$BACKLOG" -v w="$WORKERS" '
  /^B6\./ {
    c = $1; if (!(c in max)) { order[++n] = c; max[c] = 0 }
    if ($3 > max[c]) max[c] = $3
    per[c] = per[c] (per[c] == "" ? "" : ", ") $3
    opened[c] += $4; reqs[c] += $5; rps[c] += $6; runs[c]++; errs[c] += $7
  }
  END {
    desc["B6.cp"] = "clientpool.ngx, max_live " ps
    desc["B6.size"] = "OpenResty pool_size " ps " (no cap)"
    desc["B6.backlog"] = "OpenResty pool_size " ps " + backlog " bl
    for (i = 1; i <= n; i++) {
      c = order[i]
      if (c == "B6.fleet" || c == "B6.size4" || c == "B6.split4") continue
      lim = c == "B6.size" ? "" : sprintf(" (cap %d)", ps * w)
      printf "| %s | %s | %d%s; runs: %s | %.3f%% (%d / %d) | %.0f | %d |\n", c, desc[c], max[c], lim, per[c],
        100 * opened[c] / reqs[c], opened[c], reqs[c], rps[c] / runs[c], errs[c]
    }
  }' "$tsv"
echo
echo "B6 with $FLEET_WORKERS workers and one cap of $FLEET_CAP for all of them: wrk -t2 -c50 -d${B6_SECS}s, one redis PING per request; $B6_ROUNDS runs each, a fresh nginx per run"
echo
echo "| figure | upstream connections | most redis connections seen | new connections / request | requests/s | errors |"
echo "|---|---|---:|---:|---:|---:|"
awk -F'\t' -v ps="$POOL_SIZE" -v bl="$BACKLOG" -v w="$FLEET_WORKERS" -v cap="$FLEET_CAP" -v sp="$split" '
  $1 == "B6.fleet" || $1 == "B6.size4" || $1 == "B6.split4" {
    c = $1; if (!(c in max)) { order[++n] = c; max[c] = 0 }
    if ($3 > max[c]) max[c] = $3
    per[c] = per[c] (per[c] == "" ? "" : ", ") $3
    opened[c] += $4; reqs[c] += $5; rps[c] += $6; runs[c]++; errs[c] += $7
  }
  END {
    desc["B6.fleet"] = "clientpool.ngx on a fleet, max_live " cap " for all " w " workers"; lim["B6.fleet"] = cap
    desc["B6.size4"] = "OpenResty pool_size " ps " per worker (no cap)"; lim["B6.size4"] = -1
    desc["B6.split4"] = "OpenResty pool_size " sp " per worker + backlog " bl " (the cap split by hand)"; lim["B6.split4"] = sp * w
    for (i = 1; i <= n; i++) {
      c = order[i]
      l = lim[c] < 0 ? "" : sprintf(" (cap %d)", lim[c])
      printf "| %s | %s | %d%s; runs: %s | %.3f%% (%d / %d) | %.0f | %d |\n", c, desc[c], max[c], l, per[c],
        100 * opened[c] / reqs[c], opened[c], reqs[c], rps[c] / runs[c], errs[c]
    }
  }' "$tsv"
echo
# A figure no round measured (B2_ROUNDS=0, B6_ROUNDS=0, ...) is "not run",
# never "met".
awk -F'\t' -v ps="$POOL_SIZE" -v w="$WORKERS" -v cap="$FLEET_CAP" '
  function verdict(seen, ok) { return !seen ? "not run" : ok ? "met" : "MISSED" }
  $1 == "B6.fleet" { if ($3 > fm) fm = $3; sf = 1 }
  $1 == "B2.ngx.lease" { b2l = $2; s2l = 1 } $1 == "B2.ngx.checkout" { b2c = $2; s2c = 1 }
  $1 == "B5.lease" { l = $2; s5l = 1 } $1 == "B5.checkout" { co = $2; s5c = 1 }
  $1 == "B6.cp" { if ($3 > m) m = $3; o += $4; q += $5; s6 = 1 }
  END {
    printf "targets: B2 in nginx <= 3.00x: lease %.2fx %s, checkout %.2fx %s; ", b2l, verdict(s2l, b2l <= 3),
      b2c, verdict(s2c, b2c <= 3)
    printf "B5 <= 1.30x: lease %.2fx %s, checkout %.2fx %s; ", l, verdict(s5l, l <= 1.30), co, verdict(s5c, co <= 1.30)
    printf "B6 <= %d connections: %d %s; <= 0.1%% new per request: %.3f%% %s; ", ps * w, m, verdict(s6, m <= ps * w),
      (q > 0 ? 100 * o / q : 0), verdict((s6 && q > 0), (q > 0 && o / q <= 0.001))
    printf "B6 on a fleet (4 workers) <= %d connections: %d %s\n", cap, fm, verdict(sf, fm <= cap)
  }' "$tsv"

if grep -E '\[(alert|emerg)\]|exited on signal' "$run/error.log" >&2; then
  die "error.log has alerts or crashes (above)"
fi
