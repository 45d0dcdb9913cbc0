#!/usr/bin/env bash
# spec/nginx/redisfleet/run.sh - the fleet across machines in real nginx
# (issue 16, docs/fleet.md section 14): two nginx instances stand in for
# two machines (machine = "m1", "m2": each its own machine-local fleet and
# lease; 2 workers each, one worker's timer is the machine's agent,
# talking to the coordinating redis-server through cosockets). Their pools
# reach a second redis-server, the target, whose INFO clients is sampled
# every 10 ms (bench/nginx/sample.lua) while wrk loads both instances at
# once. All servers on 127.0.0.1 free ports, always stopped by pid.
#
# Checks: the target never sees more than the fleet's max_live (6) from
# both instances together; every request succeeds; /fleet shows both
# machines in Redis; kill -9 of m1's agent worker under load: another is
# agent, the cap holds; HUP of m1 under load: a new worker is agent, the
# cap holds. Ends with "N passed, M failed".
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
base=$root/build/nginx-redisfleet
nginx_bin=${NGINX:-nginx}
redis_bin=${REDIS_SERVER:-redis-server}
SECS=${RFLEET_SECS:-4}
CAP=6

passed=0 failed=0
note() { echo "nginx-redisfleet: $*"; }
check() {
  local name=$1; shift
  if "$@"; then echo "ok - $name"; passed=$((passed + 1)); else echo "not ok - $name"; failed=$((failed + 1)); fi
}

. "$root/scripts/servers.sh"
# servers.sh works on $run: one dir per server here
cleanup() {
  for run in "$base/m1" "$base/m2"; do nginx_stop; done
  for run in "$base/coord" "$base/target"; do redis_stop; done
  rm -f /dev/shm/clientpool.*.n."$fname".m[12]* 2>/dev/null
  return 0
}
die() { note "$*"; cleanup; echo "$passed passed, $((failed + 1)) failed"; exit 1; }
run=$base
need_tools wrk

rm -rf "$base"
for d in m1 m2 coord target; do mkdir -p "$base/$d/tmp" "$base/$d/logs" || die "cannot make $base/$d"; done
trap cleanup EXIT

coord_port=$(free_port); target_port=$(free_port); p1=$(free_port); p2=$(free_port)
fname="rfleet-spec-$p1-$$"

run=$base/coord; redis_start "$coord_port"
run=$base/target; redis_start "$target_port"

for m in m1 m2; do
  run=$base/$m
  port=$p1; [ "$m" = m2 ] && port=$p2
  cat >"$run/rfleet_conf.lua" <<EOC
return { name = "$fname", machine = "$m", coord_port = $coord_port, target_port = $target_port, max_live = $CAP,
         ttl = 1 }
EOC
  {
    nginx_preamble "$run" 2 warn 4096
    cat <<EOC

http {
  access_log off;
$(nginx_temp_paths "$run")
  lua_package_path "$here/?.lua;$here/../?.lua;$root/lua/?.lua;$root/lua/?/init.lua;$run/?.lua;;";
  lua_package_cpath "$root/build/luajit/?.so;;";
  init_by_lua_block { require("rfleet_app").init() }
  init_worker_by_lua_block { require("rfleet_app").init_worker() }
  server {
    listen 127.0.0.1:$port;
    location = /ping { return 200 "pong\n"; }
    location = /redis { content_by_lua_block { require("rfleet_app").redis() } }
    location = /fleet { content_by_lua_block { require("rfleet_app").fleet() } }
    location = /stats { content_by_lua_block { require("rfleet_app").stats() } }
  }
}
EOC
  } >"$run/nginx.conf"
  nginx_start "$port"
done

# the first lease comes after the fresh server's quiet ttl (1 s)
ok=""
for _ in $(seq 1 100); do
  if curl -fs "http://127.0.0.1:$p1/redis" >/dev/null && curl -fs "http://127.0.0.1:$p2/redis" >/dev/null; then
    ok=1; break
  fi
  sleep 0.05
done
[ -n "$ok" ] || { tail -20 "$base/m1/error.log" >&2; die "no PONG through either machine's pool"; }

lua5.1 "$root/bench/nginx/sample.lua" "$target_port" $((SECS + 2)) 0.01 >"$base/sample" 2>&1 &
spid=$!
sleep 0.3
wrk -c50 -t1 -d"${SECS}s" "http://127.0.0.1:$p1/redis" >"$base/m1.wrk" 2>&1 &
w1=$!
wrk -c50 -t1 -d"${SECS}s" "http://127.0.0.1:$p2/redis" >"$base/m2.wrk" 2>&1 &
w2=$!
sleep 1
fleet_mid=$(curl -fs "http://127.0.0.1:$p1/fleet")
wait "$w1"; wait "$w2"; wait "$spid"

note "a worker of m1 (pid opened live closed_by): $(curl -fs "http://127.0.0.1:$p1/stats")"
max=$(sed -n 's/.*max=\([0-9]*\).*/\1/p' "$base/sample")
req() { sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$base/$1.wrk"; }
non2xx() { sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$base/$1.wrk" | head -1; }
note "the target: $(cat "$base/sample")"
note "m1 $(req m1) requests (non-2xx $(non2xx m1)), m2 $(req m2) (non-2xx $(non2xx m2)); the target's max $max (cap $CAP)"
note "/fleet under load (leased live max_live machines | this machine: live cap): $fleet_mid"
check "the target never sees more than $CAP connections from both machines" test "${max:-99}" -le "$CAP"
check "the target saw the pools' connections" test "${max:-0}" -ge 2
check "m1: every request succeeded" test -z "$(non2xx m1)" -o "$(non2xx m1)" = 0
check "m2: every request succeeded" test -z "$(non2xx m2)" -o "$(non2xx m2)" = 0
check "m1 and m2 served requests" test "$(req m1)" -gt 100 -a "$(req m2)" -gt 100
check "/fleet: both machines hold leases in redis" test "$(echo "$fleet_mid" | awk '{print $4}')" = 2

# 2. kill -9 of m1's agent (a worker) under load: m1's other worker (or its
# replacement) takes over before m1's lease lapses; the cap holds
agent_pid=""
for _ in $(seq 1 50); do
  l=$(curl -fs "http://127.0.0.1:$p1/stats")
  case $l in *" agent "*) agent_pid=${l%% *}; break ;; esac
done
check "m1 has an agent worker" test -n "$agent_pid"
lua5.1 "$root/bench/nginx/sample.lua" "$target_port" $((SECS + 2)) 0.01 >"$base/sample2" 2>&1 &
spid=$!
sleep 0.3
wrk -c50 -t1 -d"${SECS}s" "http://127.0.0.1:$p1/redis" >"$base/m1.wrk" 2>&1 &
w1=$!
wrk -c50 -t1 -d"${SECS}s" "http://127.0.0.1:$p2/redis" >"$base/m2.wrk" 2>&1 &
w2=$!
sleep 1
[ -n "$agent_pid" ] && kill -9 "$agent_pid"
t_kill=$(date +%s%N)
new_agent=""
for _ in $(seq 1 300); do
  l=$(curl -fs "http://127.0.0.1:$p1/stats")
  case $l in *" agent "*) new_agent=${l%% *}; break ;; esac
  sleep 0.01
done
t_new=$(date +%s%N)
wait "$w1"; wait "$w2"; wait "$spid"
max=$(sed -n 's/.*max=\([0-9]*\).*/\1/p' "$base/sample2")
sock_errors() {
  local l
  l=$(grep "Socket errors" "$base/$1.wrk") || { echo 0; return; }
  echo "$l" | grep -o '[0-9]\+' | awk '{ n += $1 } END { print n + 0 }'
}
note "kill -9 of m1's agent $agent_pid: worker $new_agent agent $(( (t_new - t_kill) / 1000000 )) ms later (seen through /stats)"
note "m1 $(req m1) requests (non-2xx $(non2xx m1), socket errors $(sock_errors m1)), m2 $(req m2) (non-2xx $(non2xx m2)); the target: $(cat "$base/sample2")"
check "kill -9 of the agent: another worker of m1 is its agent" test -n "$new_agent" -a "$new_agent" != "$agent_pid"
check "kill -9 of the agent: the target never sees more than $CAP" test "${max:-99}" -le "$CAP"
check "kill -9 of the agent: m1's other requests kept succeeding (no non-2xx)" test -z "$(non2xx m1)" -o "$(non2xx m1)" = 0
check "kill -9 of the agent: m2 unaffected" test -z "$(non2xx m2)" -o "$(non2xx m2)" = 0

# 3. a reload (HUP) of m1 under load: the old agent hands over as its
# worker exits, a new worker is agent, the cap holds
lua5.1 "$root/bench/nginx/sample.lua" "$target_port" $((SECS + 2)) 0.01 >"$base/sample3" 2>&1 &
spid=$!
sleep 0.3
wrk -c50 -t1 -d"${SECS}s" "http://127.0.0.1:$p1/redis" >"$base/m1.wrk" 2>&1 &
w1=$!
wrk -c50 -t1 -d"${SECS}s" "http://127.0.0.1:$p2/redis" >"$base/m2.wrk" 2>&1 &
w2=$!
sleep 1
old_workers=$(ps -o pid= --ppid "$(cat "$base/m1/nginx.pid")" | tr -d ' ' | sort | tr '\n' ' ')
kill -HUP "$(cat "$base/m1/nginx.pid")"
wait "$w1"; wait "$w2"; wait "$spid"
max=$(sed -n 's/.*max=\([0-9]*\).*/\1/p' "$base/sample3")
agent_after=""
for _ in $(seq 1 100); do
  l=$(curl -fs "http://127.0.0.1:$p1/stats")
  case $l in *" agent "*) agent_after=${l%% *}; break ;; esac
  sleep 0.02
done
note "HUP of m1 under load: m1 $(req m1) requests (non-2xx $(non2xx m1)), m2 $(req m2) (non-2xx $(non2xx m2)); the target: $(cat "$base/sample3"); m1's agent now $agent_after (old workers: $old_workers)"
check "HUP under load: the target never sees more than $CAP" test "${max:-99}" -le "$CAP"
check "HUP under load: m1's requests kept succeeding" test -z "$(non2xx m1)" -o "$(non2xx m1)" = 0
check "HUP under load: m2 unaffected" test -z "$(non2xx m2)" -o "$(non2xx m2)" = 0
case " $old_workers " in *" $agent_after "*) new=no ;; *) new=yes ;; esac
check "HUP: a new worker of m1 is its agent" test -n "$agent_after" -a "$new" = yes

cleanup
trap - EXIT
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
