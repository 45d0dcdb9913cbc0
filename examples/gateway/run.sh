#!/usr/bin/env bash
# examples/gateway/run.sh - make demo: a Redis-backed nginx gateway under
# load, clientpool against bare lua-resty-redis.
#
# Starts a private redis-server and an nginx gateway (4 workers, Debian's
# nginx with the Lua module) on free 127.0.0.1 ports under build/demo, and
# for each configuration, in a fresh nginx: wrk for DEMO_SECS seconds while
# a side process (bench/nginx/sample.lua) reads redis's INFO clients every
# ~10 ms. Every request reads one key through the real lua-resty-redis:
#   cp       clientpool: cpngx.driver{ preset = "redis" }, max_live per worker
#   fleet    the same on a fleet: one max_live for all workers (init_by_lua)
#   size     bare lua-resty-redis: connect(pool_size) + set_keepalive
#   backlog  the same with backlog
# Then it prints a table (most upstream connections, new connections per
# request from redis's total_connections_received, p50/p99, errors, req/s)
# and writes build/demo/connections.svg (upstream connections over time).
# Everything it started is stopped by pid, also on error or Ctrl-C.
#
# environment: DEMO_SECS (6), DEMO_CONNECTIONS (wrk -c, 100), DEMO_PER_WORKER
# (8: max_live / pool_size per worker), DEMO_FLEET (8: the fleet's max_live for
# all workers together), DEMO_BACKLOG (64), NGINX, REDIS_SERVER,
# NGINX_MODULES (default /usr/lib/nginx/modules).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
run=$root/build/demo
nginx_bin=${NGINX:-nginx}
redis_bin=${REDIS_SERVER:-redis-server}
SECS=${DEMO_SECS:-6}
CONNS=${DEMO_CONNECTIONS:-100}
PER_WORKER=${DEMO_PER_WORKER:-8}
BACKLOG=${DEMO_BACKLOG:-64}
FLEET=${DEMO_FLEET:-8}
WORKERS=4
SAMPLE_EVERY=0.01

note() { echo "demo: $*" >&2; }
die() { note "$*"; exit 1; }

. "$root/scripts/servers.sh"
need_tools wrk
[ -f /usr/share/lua/5.1/nginx/redis.lua ] || [ -f /usr/share/lua/5.1/resty/redis.lua ] ||
  die "no lua-resty-redis (lua-nginx-redis): scripts/deps.sh installs it"

rm -rf "$run"
mkdir -p "$run/tmp" || die "cannot make $run"

port=$(free_port); redis_port=$(free_port)
while [ "$redis_port" = "$port" ]; do redis_port=$(free_port); done
[ -n "$port" ] && [ -n "$redis_port" ] || die "cannot find free ports"

wrk_pid= sampler=
cleanup() {
  local rc=$?
  for p in $wrk_pid $sampler; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  nginx_stop
  redis_stop
  [ -n "${fleet_shm:-}" ] && rm -f "/dev/shm/$fleet_shm"   # the fleet's segment
  return $rc
}
trap cleanup EXIT
trap 'echo; note "interrupted: stopping what it started"; exit 130' INT TERM

# ---------------------------------------------------------------- servers
redis_start "$redis_port"
redis-cli -p "$redis_port" set demo:greeting "hello from redis" >/dev/null

fleet="clientpool-demo-$port-$$"
fleet_shm=$(luajit -e "package.cpath='$root/build/luajit/?.so;'..package.cpath
  print(require('clientpool.core').fleet.shm_name('$fleet'):sub(2))" 2>/dev/null)
lua_conf demo_conf redis_port="$redis_port" per_worker="$PER_WORKER" backlog="$BACKLOG" \
  fleet="\"$fleet\"" fleet_max_live="$FLEET"
export NGINX_HTTP_EXTRA='init_by_lua_block { require("redis_pool").init_fleet() }'

nginx_conf $WORKERS "$port" "$here" <<'EOF'
location = /cp { content_by_lua_block { require("gateway").cp() } }
location = /fleet { content_by_lua_block { require("gateway").fleet() } }
location = /size { content_by_lua_block { require("gateway").size() } }
location = /backlog { content_by_lua_block { require("gateway").backlog() } }
EOF

echo "== clientpool demo: an nginx gateway ($WORKERS workers) reading redis through lua-resty-redis"
echo "   $("$nginx_bin" -v 2>&1 | sed 's/.*: //'), redis $("$redis_bin" --version | sed 's/.* v=\([^ ]*\).*/\1/') on" \
     "127.0.0.1:$redis_port; wrk -c$CONNS for ${SECS}s per configuration; run dir build/demo"

# Shows the sampler's last reading while wrk runs (one line, redrawn on a
# terminal; a line a second otherwise).
progress() {
  local label=$1 series=$2 t0 now n most=0 last
  t0=$(date +%s.%N)
  while kill -0 "$wrk_pid" 2>/dev/null; do
    sleep 0.25
    last=$(tail -n 1 "$series" 2>/dev/null)
    n=${last#* }; [ -n "$n" ] && [ "$n" != "$last" ] || n=0
    [ "$n" -gt "$most" ] && most=$n
    now=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ -t 1 ]; then
      printf '\r   %-9s %4s / %s s   redis connections now %4d, most %4d ' "$label" "$now" "$SECS" "$n" "$most"
    elif [ "${now%.*}" != "${shown:-}" ]; then
      shown=${now%.*}
      printf '   %-9s %4s / %s s   redis connections now %4d, most %4d\n' "$label" "$now" "$SECS" "$n" "$most"
    fi
  done
  [ -t 1 ] && echo
}

for cfg in ${DEMO_CONFIGS:-cp fleet size backlog}; do
  redis_quiet "$redis_port"
  nginx_start "$port"
  lua5.1 "$root/bench/nginx/sample.lua" "$redis_port" "$(awk -v s="$SECS" 'BEGIN { print s + 0.8 }')" \
    "$SAMPLE_EVERY" "$run/$cfg.series" >"$run/$cfg.sample" 2>&1 &
  sampler=$!
  sleep 0.3
  wrk -t2 -c"$CONNS" -d"${SECS}s" --latency "http://127.0.0.1:$port/$cfg" >"$run/$cfg.wrk" 2>&1 &
  wrk_pid=$!
  progress "$cfg" "$run/$cfg.series"
  wait "$wrk_pid" || { cat "$run/$cfg.wrk" >&2; die "wrk failed ($cfg)"; }
  wrk_pid=
  wait "$sampler"; sampler=
  grep -q '^max=' "$run/$cfg.sample" || { cat "$run/$cfg.sample" >&2; die "the sampler failed ($cfg)"; }
  nginx_stop
done

echo
svg=$root/build/demo/connections.svg
lua5.1 "$here/report.lua" "$run" "$svg" "$WORKERS" "$PER_WORKER" "$BACKLOG" "$SECS" "$CONNS" "$FLEET" ||
  die "report failed"
echo
echo "picture of the upstream connections over time: $svg"
if grep -E '\[(alert|emerg)\]|exited on signal' "$run/error.log" >&2; then
  die "nginx's error.log has alerts or crashes (above)"
fi
