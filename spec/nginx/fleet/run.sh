#!/usr/bin/env bash
# spec/nginx/fleet/run.sh - the fleet in real nginx (issue 14): 4 workers
# whose pools take their budget from one fleet (max_live = 8, made in
# init_by_lua), a private redis-server, wrk -c100, and a side process
# sampling redis's INFO clients every 10 ms (bench/nginx/sample.lua: its
# own connection excluded). Both servers on 127.0.0.1 free ports, always
# stopped by pid.
#
# Checks: under load redis never sees more than 8 connections; kill -9 of a
# worker under load: the other workers' requests keep succeeding, the dead
# worker's share is reclaimed (the time from the kill to the reclaim, seen
# through /fleet, is printed), and after the load the fleet's live count
# equals what redis holds; a reload (HUP) under load holds the cap.
# Then, nginx started again (the stale segment recovered): rebalance, the
# fleet's 8 held idle by three workers (3 + 3 + 2) while the fourth has 2
# callers waiting: the idle ones are shed to it (served, the wait printed
# against the bound: the idle workers' 0.25 s tick), redis sampled
# throughout never above 8.
# Ends with "N passed, M failed".
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
run=$root/build/nginx-fleet
nginx_bin=${NGINX:-nginx}
redis_bin=${REDIS_SERVER:-redis-server}
SECS=${FLEET_SECS:-5}
CAP=8

passed=0 failed=0
note() { echo "nginx-fleet: $*"; }
die() { note "$*"; cleanup; echo "$passed passed, $((failed + 1)) failed"; exit 1; }
check() {
  local name=$1; shift
  if "$@"; then echo "ok - $name"; passed=$((passed + 1)); else echo "not ok - $name"; failed=$((failed + 1)); fi
}

. "$root/scripts/servers.sh"
cleanup() {
  nginx_stop
  redis_stop
  [ -n "${fname:-}" ] && rm -f "/dev/shm/$(fleet_shm "$fname")" "/dev/shm/$(fleet_shm "$fname-noquit")" 2>/dev/null
  return 0
}
need_tools wrk

rm -rf "$run"
mkdir -p "$run/tmp" "$run/logs" || die "cannot make $run"
trap cleanup EXIT

port=$(free_port); redis_port=$(free_port); rport=$(free_port)
while [ "$redis_port" = "$port" ]; do redis_port=$(free_port); done
while [ "$rport" = "$port" ] || [ "$rport" = "$redis_port" ]; do rport=$(free_port); done
fname="nginx-fleet-spec-$port-$$"

# the segment's name (for the cleanup of a stale one)
fleet_shm() {
  luajit -e "package.cpath='$root/build/luajit/?.so;'..package.cpath
    print(require('clientpool.core').fleet.shm_name('$1'):sub(2))" 2>/dev/null
}

cat >"$run/fleet_conf.lua" <<EOF
return { name = "$fname", redis_port = $redis_port, max_live = $CAP }
EOF

{
  nginx_preamble "$run" 4 warn 4096
  cat <<EOF

http {
  access_log off;
$(nginx_temp_paths "$run")
  lua_package_path "$here/?.lua;$here/../?.lua;$root/lua/?.lua;$root/lua/?/init.lua;$run/?.lua;;";
  lua_package_cpath "$root/build/luajit/?.so;;";
  init_by_lua_block { require("fleet_app").init() }
  init_worker_by_lua_block { require("fleet_app").init_worker() }
  server {
    listen 127.0.0.1:$port;
    location = /ping { return 200 "pong\n"; }
    location = /redis { content_by_lua_block { require("fleet_app").redis() } }
    location = /retire { content_by_lua_block { require("fleet_app").retire() } }
    location = /fleet { content_by_lua_block { require("fleet_app").fleet() } }
    location = /stats { content_by_lua_block { require("fleet_app").stats() } }
  }
  # the rebalance case: reuseport spreads new connections over the workers
  server {
    listen 127.0.0.1:$rport reuseport;
    location = /fill { content_by_lua_block { require("fleet_app").fill() } }
    location = /want { content_by_lua_block { require("fleet_app").want() } }
    location = /members { content_by_lua_block { require("fleet_app").members() } }
  }
}
EOF
} >"$run/nginx.conf"

redis_start "$redis_port"
nginx_start "$port"

redis_clients() {
  redis-cli -p "$redis_port" info clients 2>/dev/null | tr -d '\r' | sed -n 's/^connected_clients://p'
}
fleet_line() { curl -fs "http://127.0.0.1:$port/fleet"; }
workers() { ps -o pid= --ppid "$(cat "$run/nginx.pid")" | tr -d ' '; }

for _ in $(seq 1 20); do curl -fs "http://127.0.0.1:$port/redis" >/dev/null || die "GET /redis failed"; done
check "4 workers" test "$(workers | wc -l)" = 4

# One load phase: sampler + wrk; $1 = name, $2 = an action run at 1/3 of the
# load (a function name, or "none"), $3 = the path (default /redis), $4 =
# the seconds (default SECS), $5 = the sampler's interval (default 0.01).
# Leaves $run/<name>.{sample,wrk}.
load_phase() {
  local name=$1 action=$2 path=${3:-/redis} secs=${4:-$SECS} every=${5:-0.01}
  lua5.1 "$root/bench/nginx/sample.lua" "$redis_port" $((secs + 2)) "$every" "$run/$name.series" \
    >"$run/$name.sample" 2>&1 &
  local spid=$!
  sleep 0.3
  wrk -c100 -t2 -d"${secs}s" "http://127.0.0.1:$port$path" >"$run/$name.wrk" 2>&1 &
  local wpid=$!
  sleep "$(awk -v s="$secs" 'BEGIN { print s / 3 }')"
  [ "$action" = none ] || "$action"
  wait "$wpid"
  wait "$spid"
}
sample_max() { sed -n 's/.*max=\([0-9]*\).*/\1/p' "$run/$1.sample"; }
sample_opened() { sed -n 's/.*opened=\([0-9]*\).*/\1/p' "$run/$1.sample"; }
non2xx() { sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$run/$1.wrk" | head -1; }
requests() { sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$run/$1.wrk"; }
sock_errors() {
  local l
  l=$(grep "Socket errors" "$run/$1.wrk") || { echo 0; return; }
  echo "$l" | grep -o '[0-9]\+' | awk '{ n += $1 } END { print n + 0 }'
}

# 1. the cap under load
load_phase steady none
note "steady: $(requests steady) requests, redis max $(sample_max steady) connections (cap $CAP), non-2xx $(non2xx steady)"
check "steady load: redis never sees more than $CAP pool connections" test "$(sample_max steady)" -le "$CAP"
check "steady load: redis saw the pool's connections at all" test "$(sample_max steady)" -ge 1
check "steady load: every request succeeded" test -z "$(non2xx steady)" -o "$(non2xx steady)" = 0
check "steady load: requests were served" test "$(requests steady)" -gt 100

# 1b. churn: every request retires its connection, so the fleet's slots
# pass from worker to worker all the time. The pool's close waits for
# redis's (option quit): redis has let a connection go before its slot
# is free, and never counts more than the cap. The same churn through a
# pool without quit (a fleet of its own) is printed for comparison: redis
# counts a closed connection until it reads the FIN, so it may see more
# (not checked: that depends on redis's timing).
churn_secs=$(( SECS > 3 ? 3 : SECS ))
load_phase churn none /retire "$churn_secs" 0
note "churn: $(requests churn) requests, $(sample_opened churn) connections opened, redis max $(sample_max churn) (cap $CAP), non-2xx $(non2xx churn)"
check "churn: redis never sees more than $CAP pool connections" test "$(sample_max churn)" -le "$CAP"
check "churn: connections were retired and opened again (over 100)" test "$(sample_opened churn)" -gt 100
check "churn: every request succeeded" test -z "$(non2xx churn)" -o "$(non2xx churn)" = 0
load_phase churn_noquit none "/retire?noquit=1" "$churn_secs" 0
note "churn without quit (not checked): $(requests churn_noquit) requests, $(sample_opened churn_noquit)" \
  "opened, redis max $(sample_max churn_noquit) (cap $CAP)"

# 2. kill -9 of a worker under load
kill_worker() {
  victim=$(workers | head -1)
  local before
  before=$(fleet_line | awk '{print $4}')
  t_kill=$(date +%s%N)
  kill -9 "$victim"
  t_back=""
  for _ in $(seq 1 500); do
    local r
    r=$(fleet_line | awk '{print $4}')
    if [ -n "$r" ] && [ "$r" -gt "$before" ]; then t_back=$(date +%s%N); break; fi
    sleep 0.01
  done
}
load_phase kill kill_worker
if [ -n "$t_back" ]; then
  note "kill -9 of worker $victim under load: its share reclaimed $(( (t_back - t_kill) / 1000000 )) ms later"
fi
note "kill: $(requests kill) requests, redis max $(sample_max kill), non-2xx $(non2xx kill), socket errors $(sock_errors kill)"
check "kill -9: the dead worker's share was reclaimed during the load" test -n "$t_back"
check "kill -9: redis never sees more than $CAP pool connections" test "$(sample_max kill)" -le "$CAP"
check "kill -9: the other workers' requests kept succeeding (no non-2xx)" \
  test -z "$(non2xx kill)" -o "$(non2xx kill)" = 0
check "kill -9: at most the killed worker's requests in flight failed" test "$(sock_errors kill)" -le 100
check "kill -9: a new worker took its place" test "$(workers | wc -l)" = 4

# after the load: the fleet's live count is what redis holds (redis-cli aside)
settled=""
for _ in $(seq 1 50); do
  fl=$(fleet_line | awk '{print $1}')
  rc=$(( $(redis_clients) - 1 ))
  if [ "$fl" = "$rc" ]; then settled=1; break; fi
  sleep 0.1
done
note "after the load: fleet live $fl, redis connections $rc"
check "after the load: the fleet's live count equals redis's connections" test -n "$settled"

# 3. a reload (HUP) under load
hup() { kill -HUP "$(cat "$run/nginx.pid")"; }
load_phase reload hup
note "reload: $(requests reload) requests, redis max $(sample_max reload), non-2xx $(non2xx reload)"
check "HUP under load: redis never sees more than $CAP pool connections" test "$(sample_max reload)" -le "$CAP"
check "HUP under load: requests kept succeeding" test -z "$(non2xx reload)" -o "$(non2xx reload)" = 0
# the old workers exit once their requests are done; their rows are
# reclaimed once they are dead (their units came back only then)
for _ in $(seq 1 100); do [ "$(workers | wc -l)" = 4 ] && break; sleep 0.1; done
check "HUP: the old workers exited, 4 workers" test "$(workers | wc -l)" = 4
for _ in $(seq 1 100); do
  members=$(fleet_line | awk '{print $3}')
  [ "$members" = 4 ] && break
  sleep 0.1
done
check "HUP: the fleet's members are the 4 new workers (the old ones reclaimed)" test "$members" = 4

nginx_stop
redis_quiet "$redis_port"
check "nginx stopped: redis has no pool connection left" test "$(redis_clients)" = 1

# 4. rebalance: three workers hold the fleet's cap idle, the fourth waits
nginx_start "$port"
check "restart: the stale segment recovered, nothing held" test "$(fleet_line | awk '{print $1}')" = 0
lua5.1 "$root/bench/nginx/sample.lua" "$redis_port" 6 0.01 "$run/rebalance.series" >"$run/rebalance.sample" 2>&1 &
spid=$!
sleep 0.3
filled=0 tries=0
while [ "$filled" -lt 3 ] && [ "$tries" -lt 400 ]; do
  tries=$((tries + 1))
  n=3; [ "$filled" = 2 ] && n=2
  r=$(curl -fs "http://127.0.0.1:$rport/fill?n=$n")
  case $r in filled*) filled=$((filled + 1)); note "rebalance: $r";; esac
done
check "rebalance: three workers hold the fleet's 8 idle" test "$(fleet_line | awk '{print $2}')" = "$CAP"
want="" tries=0
while [ -z "$want" ] && [ "$tries" -lt 400 ]; do
  tries=$((tries + 1))
  r=$(curl -fs "http://127.0.0.1:$rport/want?n=2")
  case $r in want*) want=$r;; esac
done
note "rebalance: $want (pid, callers served, longest wait in ms; bound: the idle workers' 0.25 s tick," \
  "plus the destroy and one poll)"
note "rebalance: members pid:live:idle $(curl -fs "http://127.0.0.1:$rport/members")"
check "rebalance: the waiting worker's 2 callers were served by idle clients shed elsewhere" \
  test "$(echo "$want" | awk '{print $3}')" = 2
wait "$spid"
note "rebalance: redis max $(sample_max rebalance) connections (cap $CAP)"
check "rebalance: redis never sees more than $CAP pool connections" test "$(sample_max rebalance)" -le "$CAP"
settled=""
for _ in $(seq 1 50); do
  fl=$(fleet_line | awk '{print $1}')
  rc=$(( $(redis_clients) - 1 ))
  if [ "$fl" = "$rc" ]; then settled=1; break; fi
  sleep 0.1
done
check "rebalance: the fleet's live count equals redis's connections ($fl)" test -n "$settled"

nginx_stop
redis_quiet "$redis_port"
cleanup
trap - EXIT
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
