#!/usr/bin/env bash
# spec/nginx/run.sh - run the OpenResty specs in a private nginx against a
# private redis-server, both on 127.0.0.1 and both always stopped.
#
# usage: spec/nginx/run.sh [CASE...]     (default: every spec/nginx/cases/*.lua)
#
# Steps: pick two free loopback ports; start redis-server (no persistence,
# daemonized, pid file under the run dir); write nginx.conf (Debian's nginx
# with ndk + lua modules, one worker, error log, pid and temp paths under
# build/nginx-spec) and start nginx; GET /run/<case> for each case file (the
# harness runs the file inside nginx and answers TAP-like lines); then the
# external checks (wrk load against a pool while redis is sampled; the old
# worker exits quickly after a reload). Before any request: the warm floor
# (the init_worker block of docs/hosts.md, taken from the file as it is
# written) runs in a second nginx with two workers, and redis must see
# min_idle connections per worker, and none once that nginx stopped; the
# README's OpenResty quick start (its nginx.conf and redis_pool.lua, as
# written) runs in a third nginx and answers +PONG; the main nginx's floor
# is checked the same way before its first request. Code blocks come from
# the documentation by their markers, <!-- spec:NAME nginx --> (doc_block;
# docs/testing.md). The exiting-worker case, which sends nginx a HUP, runs
# last; then make demo's gateway for a second per configuration
# (examples/gateway/run.sh). Ends with "N
# passed, M failed"; exit status 1 on any failure. The run dir stays for
# inspection (error.log, redis.log).
#
# environment: NGINX (default nginx), REDIS_SERVER (default redis-server),
# EXTRA_LUA_PATH (prepended to lua_package_path, e.g. "/tmp/x/?.lua;"),
# NGINX_MODULES (default /usr/lib/nginx/modules), KEEP=1 leaves both servers
# running (for debugging; stop them yourself), WITH_LOAD=1 runs the wrk
# checks before the exiting case also when cases are named.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
run=$root/build/nginx-spec
nginx_bin=${NGINX:-nginx}
redis_bin=${REDIS_SERVER:-redis-server}
mods=${NGINX_MODULES:-/usr/lib/nginx/modules}

passed=0 failed=0
note() { echo "nginx-spec: $*"; }

# A check done from here (outside nginx): name, then a command that succeeds.
check() {
  local name=$1; shift
  if "$@"; then
    echo "[external] ok - $name"
    passed=$((passed + 1))
  else
    echo "[external] not ok - $name"
    failed=$((failed + 1))
  fi
}

die() {
  note "$*"
  echo "0 passed, 1 failed"
  exit 1
}

command -v "$nginx_bin" >/dev/null || die "no nginx ($nginx_bin): install nginx libnginx-mod-http-lua lua-resty-core"
command -v "$redis_bin" >/dev/null || die "no redis-server ($redis_bin)"
command -v curl >/dev/null || die "no curl"
command -v redis-cli >/dev/null || die "no redis-cli (redis-tools)"
[ -f "$mods/ngx_http_lua_module.so" ] || die "no $mods/ngx_http_lua_module.so (libnginx-mod-http-lua)"
[ -f "$root/build/luajit/clientpool/core.so" ] || die "build/luajit/clientpool/core.so missing: run make"

rm -rf "$run"
mkdir -p "$run/tmp" "$run/logs" || die "cannot make $run"
. "$root/scripts/servers.sh"   # nginx_preamble, nginx_temp_paths

# Free loopback ports: bind port 0 and read back what the kernel gave.
free_port() {
  lua5.1 -e 'local s = assert(require("socket").bind("127.0.0.1", 0)); local _, p = s:getsockname(); print(p); s:close()' 2>/dev/null ||
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
port=$(free_port); redis_port=$(free_port)
while [ "$redis_port" = "$port" ]; do redis_port=$(free_port); done
redis2_port=$(free_port)   # a second redis-server, for faults (spec/nginx/faultctl.sh)
while [ "$redis2_port" = "$port" ] || [ "$redis2_port" = "$redis_port" ]; do redis2_port=$(free_port); done
[ -n "$port" ] && [ -n "$redis_port" ] || die "cannot find free ports"
# the metrics nginx (docs/metrics.md's recipe, three workers): /metrics and /work
metrics_port=$(free_port); metrics_work_port=$(free_port)
while [ "$metrics_port" = "$port" ] || [ "$metrics_port" = "$redis_port" ] || [ "$metrics_port" = "$redis2_port" ]; do
  metrics_port=$(free_port)
done
while [ "$metrics_work_port" = "$metrics_port" ] || [ "$metrics_work_port" = "$port" ] ||
      [ "$metrics_work_port" = "$redis_port" ] || [ "$metrics_work_port" = "$redis2_port" ]; do
  metrics_work_port=$(free_port)
done

nginx_pid() { cat "$run/nginx.pid" 2>/dev/null; }

# Stops an nginx by its master pid: QUIT, then KILL (workers too) after 5 s.
stop_nginx() {
  local pid=$1 workers
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -QUIT "$pid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  workers=$(ps -o pid= --ppid "$pid" 2>/dev/null)
  note "nginx did not stop in 5 s: killing master $pid and workers" $workers
  kill -KILL "$pid" $workers 2>/dev/null
  return 1
}

cleanup() {
  local rc=$?
  stop_nginx "$(cat "$run/floor/nginx.pid" 2>/dev/null)"
  stop_nginx "$(cat "$run/quickstart/nginx.pid" 2>/dev/null)"
  stop_nginx "$(cat "$run/metrics/nginx.pid" 2>/dev/null)"
  if [ "${KEEP:-0}" = 1 ]; then
    note "KEEP=1: nginx (pid $(nginx_pid)) and redis (port $redis_port) left running"
    return $rc
  fi
  local pid workers
  pid=$(nginx_pid)
  [ -n "$pid" ] || pid=${master_pid:-}
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    workers=$(ps -o pid= --ppid "$pid" 2>/dev/null)
    kill -QUIT "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      note "nginx did not stop in 5 s: killing master $pid and workers" $workers
      workers=$(ps -o pid= --ppid "$pid" 2>/dev/null)
      kill -KILL "$pid" $workers 2>/dev/null
    fi
  fi
  # faultctl.sh kills its redis-server as it ends
  [ -n "${fault_ctl:-}" ] && kill "$fault_ctl" 2>/dev/null && wait "$fault_ctl" 2>/dev/null
  pid=$(cat "$run/redis.pid" 2>/dev/null)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- redis
"$redis_bin" --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize yes --pidfile "$run/redis.pid" --logfile "$run/redis.log" --dir "$run" \
  || die "redis-server did not start (see $run/redis.log)"
for _ in $(seq 1 50); do
  [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && break
  sleep 0.1
done
[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] || die "redis-server does not answer on $redis_port"

# Fault actions the cases ask for: a second redis-server they may kill and
# restart (spec/nginx/faultctl.sh; stopped with the rest in cleanup).
"$here/faultctl.sh" "$run" "$redis_bin" "$redis2_port" &
fault_ctl=$!

# ---------------------------------------------------------------- spec_conf
cat >"$run/spec_conf.lua" <<EOF
-- written by spec/nginx/run.sh
return {
  port = $port,
  redis_port = $redis_port,
  redis2_port = $redis2_port, -- spec/nginx/faultctl.sh: started and killed on request
  root = "$root",
  run = "$run",
  pid_file = "$run/nginx.pid",
  -- the metrics nginx (docs/metrics.md's recipe, three workers)
  metrics_port = $metrics_port,
  metrics_work_port = $metrics_work_port,
  metrics_pid_file = "$run/metrics/nginx.pid",
  metrics_workers = 3,
}
EOF

# ---------------------------------------------------------------- doc blocks
# The code block marked <!-- spec:NAME nginx --> in README.md or docs/*.md,
# as written (spec/docs_spec.lua checks that every such block is named here).
doc_block() {
  awk -v mark="<!-- spec:$1 nginx -->" '$0 == mark { m = 1; next }
       m && !b && /^```/ { b = 1; next }
       m && !b { m = 0 }
       b && /^```/ { exit }
       b { print }' "$root/README.md" "$root"/docs/*.md
}

# ---------------------------------------------------------------- warm floor
# docs/hosts.md, OpenResty: the init_worker block that starts the floor.
floor_min_idle=2   # spec/nginx/floor/redis_pool.lua
floor_block=$(doc_block nginx-floor)

# Every worker of nginx (master pid $1, $2 workers) has exactly $3
# connections named cp-floor-<worker pid> in redis.
floor_seen() {
  local master=$1 nworkers=$2 want=$3 pids list p n
  pids=$(ps -o pid= --ppid "$master" 2>/dev/null | tr -d ' ')
  [ "$(echo "$pids" | grep -c .)" -eq "$nworkers" ] || return 1
  list=$(redis-cli -p "$redis_port" CLIENT LIST 2>/dev/null) || return 1
  for p in $pids; do
    n=$(echo "$list" | grep -c " name=cp-floor-$p ")
    [ "$n" -eq "$want" ] || return 1
  done
}

# Polls floor_seen for up to 5 s; says what redis saw when it fails.
floor_check() {
  for _ in $(seq 1 100); do
    floor_seen "$@" && return 0
    sleep 0.05
  done
  echo "    workers of $1: $(ps -o pid= --ppid "$1" | tr -s ' \n' ' '); redis sees:"
  redis-cli -p "$redis_port" CLIENT LIST | grep -o 'name=cp-floor-[0-9]*' | sort | uniq -c | sed 's/^/    /'
  return 1
}

no_floor_left() {
  for _ in $(seq 1 50); do
    redis-cli -p "$redis_port" CLIENT LIST | grep -q 'name=cp-floor-' || return 0
    sleep 0.1
  done
  return 1
}

# A second nginx, two workers, no server and no request: only the README block.
floor_nginx() {
  local dir=$run/floor pid
  mkdir -p "$dir/tmp" || return 1
  [ -n "$floor_block" ] || { echo "    no <!-- spec:nginx-floor nginx --> block in README.md or docs/"; return 1; }
  cat >"$dir/nginx.conf" <<EOF2
# written by spec/nginx/run.sh: the documentation's warm floor in two workers
$(nginx_preamble "$dir" 2 info 64)
$([ "$(id -u)" = 0 ] && echo "user root;")
env CLIENTPOOL_BACKEND;
http {
$(nginx_temp_paths "$dir")
  lua_package_path "$root/spec/nginx/floor/?.lua;$root/lua/?.lua;$root/lua/?/init.lua;$run/?.lua;;";
  lua_package_cpath "$root/build/luajit/?.so;;";

$floor_block
}
EOF2
  "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>"$dir/start.log" ||
    { cat "$dir/start.log"; return 1; }
  for _ in $(seq 1 50); do [ -s "$dir/nginx.pid" ] && break; sleep 0.1; done
  pid=$(cat "$dir/nginx.pid" 2>/dev/null)
  [ -n "$pid" ] || return 1
  floor_check "$pid" 2 "$floor_min_idle"
}

floor_nginx_stops() {
  stop_nginx "$(cat "$run/floor/nginx.pid" 2>/dev/null)" && no_floor_left &&
    ! grep -E '\[(alert|emerg|error)\]|exited on signal' "$run/floor/error.log"
}

check "warm floor (docs/hosts.md's init_worker block), 2 workers, no request: redis sees min_idle=$floor_min_idle connections per worker" floor_nginx
check "that nginx stops at once (QUIT), its floor connections go, no error in its error.log" floor_nginx_stops

# ---------------------------------------------------------------- quick start
# README's OpenResty quick start as written: its nginx.conf, with the paths
# and the port put in and what a private nginx needs added (modules, pid,
# logs, temp paths), and its redis_pool.lua, with the redis port put in.
# GET /ping answers +PONG, wrk -c20 gets nothing but 200s, and redis accepts
# at most max_live (8) connections per worker.
qs_max_live=8
quickstart_nginx() {
  local dir=$run/quickstart conf pool qport pid body conns0 conns1 new workers
  mkdir -p "$dir/tmp" "$dir/app" || return 1
  conf=$(doc_block openresty-conf); pool=$(doc_block openresty-pool)
  [ -n "$conf" ] && [ -n "$pool" ] || { echo "    no openresty-conf / openresty-pool block in README.md"; return 1; }
  grep -q "max_live = $qs_max_live," <<<"$pool" || { echo "    redis_pool.lua no longer says max_live = $qs_max_live"; return 1; }
  sed "s/port = 6379,/port = $redis_port,/" <<<"$pool" >"$dir/app/redis_pool.lua"
  grep -q "port = $redis_port," "$dir/app/redis_pool.lua" || { echo "    redis_pool.lua names no port = 6379"; return 1; }
  qport=$(free_port)
  {
    echo "# written by spec/nginx/run.sh: README's OpenResty quick start"
    echo "load_module $mods/ndk_http_module.so;"
    echo "load_module $mods/ngx_http_lua_module.so;"
    [ "$(id -u)" = 0 ] && echo "user root;"
    echo "pid $dir/nginx.pid;"
    echo "error_log $dir/error.log info;"
    echo "env CLIENTPOOL_BACKEND;"
    sed -e "s#/path/to/clientpool#$root#g" -e "s#/path/to/app#$dir/app#g" \
        -e "s#listen 8080;#listen 127.0.0.1:$qport;#" <<<"$conf" |
      awk -v d="$dir" '{ print }
        /^http \{$/ { print "  access_log off;"; print "  client_body_temp_path " d "/tmp/body;";
                      print "  proxy_temp_path " d "/tmp/proxy;"; print "  fastcgi_temp_path " d "/tmp/fastcgi;";
                      print "  uwsgi_temp_path " d "/tmp/uwsgi;"; print "  scgi_temp_path " d "/tmp/scgi;" }'
  } >"$dir/nginx.conf"
  grep -q "listen 127.0.0.1:$qport;" "$dir/nginx.conf" && ! grep -q "/path/to" "$dir/nginx.conf" &&
    grep -q "scgi_temp_path" "$dir/nginx.conf" || { echo "    the quick start's nginx.conf changed shape:"; cat "$dir/nginx.conf"; return 1; }
  conns0=$(redis-cli -p "$redis_port" INFO stats | tr -d '\r' | sed -n 's/^total_connections_received://p')
  "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>"$dir/start.log" ||
    { cat "$dir/start.log"; return 1; }
  for _ in $(seq 1 50); do [ -s "$dir/nginx.pid" ] && break; sleep 0.1; done
  pid=$(cat "$dir/nginx.pid" 2>/dev/null)
  [ -n "$pid" ] || return 1
  for _ in $(seq 1 50); do
    body=$(curl -s -m 5 "http://127.0.0.1:$qport/ping") && [ -n "$body" ] && break
    sleep 0.1
  done
  [ "$body" = "+PONG" ] || { echo "    GET /ping answered: $body"; tail -5 "$dir/error.log"; return 1; }
  wrk -t2 -c20 -d1s "http://127.0.0.1:$qport/ping" >"$dir/wrk.log" 2>&1
  grep -q 'requests in' "$dir/wrk.log" && ! grep -qE 'Non-2xx|Socket errors' "$dir/wrk.log" ||
    { cat "$dir/wrk.log"; return 1; }
  workers=$(ps -o pid= --ppid "$pid" | grep -c .)
  conns1=$(redis-cli -p "$redis_port" INFO stats | tr -d '\r' | sed -n 's/^total_connections_received://p')
  new=$((conns1 - conns0 - 1))   # the second redis-cli is the one more
  echo "    quick start: $workers workers, $(grep 'requests in' "$dir/wrk.log" | tr -s ' '), redis accepted $new connections"
  [ "$new" -ge 1 ] && [ "$new" -le $((workers * qs_max_live)) ]
}

quickstart_nginx_stops() {
  stop_nginx "$(cat "$run/quickstart/nginx.pid" 2>/dev/null)" &&
    ! grep -E '\[(alert|emerg)\]|exited on signal' "$run/quickstart/error.log"
}

check "README's OpenResty quick start as written: /ping answers +PONG, wrk -c20 all 200, at most max_live connections per worker" quickstart_nginx
check "that nginx stops at once (QUIT), no alert or crash in its error.log" quickstart_nginx_stops

# ---------------------------------------------------------------- metrics
# docs/metrics.md's nginx recipe, as written there, in a nginx of three
# workers (reuseport spreads connections over them); its port is the one
# picked here. spec/nginx/cases/metrics.lua reads its /metrics.
metrics_block=$(doc_block nginx-metrics)

metrics_nginx() {
  local dir=$run/metrics pid
  mkdir -p "$dir/tmp" || return 1
  [ -n "$metrics_block" ] || { echo "    no <!-- spec:nginx-metrics nginx --> block in docs/metrics.md"; return 1; }
  echo "$metrics_block" | grep -q 'listen 127.0.0.1:9145;' ||
    { echo "    the recipe no longer listens on 127.0.0.1:9145 (run.sh puts its own port there)"; return 1; }
  cat >"$dir/nginx.conf" <<EOF2
# written by spec/nginx/run.sh: docs/metrics.md's recipe in three workers
load_module $mods/ndk_http_module.so;
load_module $mods/ngx_http_lua_module.so;
$([ "$(id -u)" = 0 ] && echo "user root;")
worker_processes 3;
env CLIENTPOOL_BACKEND;
pid $dir/nginx.pid;
error_log $dir/error.log info;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  lua_package_path "$root/spec/nginx/metrics/?.lua;$root/lua/?.lua;$root/lua/?/init.lua;$run/?.lua;;";
  lua_package_cpath "$root/build/luajit/?.so;;";
  add_header X-Clientpool-Worker \$pid always;   # which worker answered (the spec's, not the recipe's)

$(echo "$metrics_block" | sed "s/listen 127.0.0.1:9145;/listen 127.0.0.1:$metrics_port reuseport;/")

  # the spec's: one acquire and release of pool "plain" in the worker that answers
  server {
    listen 127.0.0.1:$metrics_work_port reuseport;
    location = /work {
      content_by_lua_block {
        local lease = assert(require("my_pools").plain:acquire("k0"))
        lease:release()
        ngx.say(ngx.worker.pid())
      }
    }
  }
}
EOF2
  "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>"$dir/start.log" ||
    { cat "$dir/start.log"; return 1; }
  for _ in $(seq 1 50); do [ -s "$dir/nginx.pid" ] && break; sleep 0.1; done
  pid=$(cat "$dir/nginx.pid" 2>/dev/null)
  [ -n "$pid" ] || return 1
  for _ in $(seq 1 50); do
    curl -fs --max-time 5 "http://127.0.0.1:$metrics_port/metrics" -o /dev/null 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$dir/error.log"
  return 1
}

# promtool accepts what the recipe's /metrics answers
metrics_promtool() {
  command -v promtool >/dev/null || { echo "    no promtool (apt-get install prometheus)"; return 1; }
  curl -fs "http://127.0.0.1:$metrics_port/metrics" >"$run/logs/metrics.txt" || return 1
  grep -q '^clientpool_opened_total{worker=' "$run/logs/metrics.txt" || { head -5 "$run/logs/metrics.txt"; return 1; }
  promtool check metrics <"$run/logs/metrics.txt" || return 1
}

# (the case kills one worker with SIGKILL: the master's alert about it is expected)
metrics_nginx_stops() {
  stop_nginx "$(cat "$run/metrics/nginx.pid" 2>/dev/null)" || return 1
  ! grep -E '\[(alert|emerg|error)\]|exited on signal' "$run/metrics/error.log" | grep -v 'exited on signal 9'
}

check "docs/metrics.md's nginx recipe starts in three workers and answers /metrics" metrics_nginx

# ---------------------------------------------------------------- nginx

cat >"$run/nginx.conf" <<EOF
# written by spec/nginx/run.sh
$(nginx_preamble "$run" 1 info 1024)
$([ "$(id -u)" = 0 ] && echo "user root;  # as root (CI): the exiting spec signals the master")
env CLIENTPOOL_BACKEND;  # core or ffi (the default on LuaJIT)

http {
  access_log off;
$(nginx_temp_paths "$run")

  lua_package_path "${EXTRA_LUA_PATH:-}$root/spec/nginx/?.lua;$root/?.lua;$root/spec/nginx/floor/?.lua;$root/lua/?.lua;$root/lua/?/init.lua;$run/?.lua;;";
  lua_package_cpath "$root/build/luajit/?.so;;";
  lua_shared_dict spec 1m;

  init_worker_by_lua_block { require("app").init_worker() }

  server {
    listen 127.0.0.1:$port;
    keepalive_timeout 0;

    location = /ping { return 200 "pong\n"; }

    location ~ ^/run/([A-Za-z0-9_]+)\$ {
      content_by_lua_block { require("harness").run(ngx.var[1]) }
    }

    location /app/ {
      content_by_lua_block { require("app").content() }
    }

    # an HTTP upstream in the same nginx for the pooled keep-alive client of
    # the policy and drain cases (app.upstream); keep-alive here only
    location /upstream/ {
      keepalive_timeout 60s;
      lua_check_client_abort on;
      content_by_lua_block { require("app").upstream() }
    }

    # an HTTP answer whose keep-alive connection this nginx closes 300 ms
    # after it (cases/live.lua: keepalive finds it gone)
    location = /short_keepalive {
      keepalive_timeout 300ms;
      return 200 "ok\n";
    }

    location = /app/hold_abort {
      lua_check_client_abort on;
      content_by_lua_block { require("app").content_as("hold_end") }
    }

    location = /app/wait_abort {
      lua_check_client_abort on;
      content_by_lua_block { require("app").content() }
    }

    location = /phase/set {
      set_by_lua_block \$probe_result { return require("app").phase_probe("set") }
      return 200 "\$probe_result\n";
    }
    location = /phase/rewrite {
      rewrite_by_lua_block { require("app").phase_probe("rewrite") }
      content_by_lua_block { ngx.say(ngx.shared.spec:get(ngx.var.arg_probe)) }
    }
    location = /phase/access {
      access_by_lua_block { require("app").phase_probe("access") }
      content_by_lua_block { ngx.say(ngx.shared.spec:get(ngx.var.arg_probe)) }
    }
    location = /phase/content {
      content_by_lua_block { ngx.say(require("app").phase_probe("content")) }
    }
    location = /phase/header_filter {
      content_by_lua_block { ngx.say("body") }
      header_filter_by_lua_block { require("app").phase_probe("header_filter") }
    }
    location = /phase/body_filter {
      content_by_lua_block { ngx.say("body") }
      body_filter_by_lua_block { if ngx.arg[2] then require("app").phase_probe("body_filter") end }
    }
    location = /phase/log {
      content_by_lua_block {
        local app = require "app"
        local pre = app.probes[(ngx.var.arg_probe or "") .. ":content"]
        if pre then pre() end
        ngx.say("logged")
      }
      log_by_lua_block { require("app").phase_probe("log") }
    }
  }
}
EOF

"$nginx_bin" -p "$run" -c "$run/nginx.conf" -e "$run/error.log" 2>"$run/nginx.start.log" ||
  { cat "$run/nginx.start.log"; die "nginx did not start"; }
for _ in $(seq 1 50); do [ -s "$run/nginx.pid" ] && break; sleep 0.1; done
master_pid=$(nginx_pid)
# before the first request: app.init_worker starts the same floor
check "warm floor of the spec nginx, before any request: redis sees min_idle=$floor_min_idle connections" \
  floor_check "$master_pid" 1 "$floor_min_idle"
for _ in $(seq 1 50); do
  curl -fs --max-time 5 "http://127.0.0.1:$port/ping" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs --max-time 5 "http://127.0.0.1:$port/ping" >/dev/null || { tail -20 "$run/error.log"; die "nginx does not answer on $port"; }
note "nginx pid $master_pid on 127.0.0.1:$port, redis on 127.0.0.1:$redis_port, run dir $run"

# ---------------------------------------------------------------- cases
if [ $# -gt 0 ]; then
  cases=("$@")
else
  cases=()
  for f in "$here"/cases/*.lua; do
    n=$(basename "$f" .lua)
    case $n in exiting|setup_*|check_*) ;; *) cases+=("$n") ;; esac
  done
  [ -f "$here/cases/exiting.lua" ] && cases+=(exiting)
fi

run_case() {
  local name=$1 out line p f
  out=$(curl -s -m 300 "http://127.0.0.1:$port/run/$name")
  echo "$out" | sed "s/^/[$name] /"
  line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
  if [ -z "$line" ]; then
    note "$name: no summary line (crashed or timed out); error.log tail:"
    tail -n 30 "$run/error.log" | sed 's/^/    /'
    failed=$((failed + 1))
    return
  fi
  read -r p _ f _ <<<"$line"
  passed=$((passed + p)); failed=$((failed + f))
}

# wrk load on one pool while redis is sampled: never more connections than max_live.
wrk_load() {
  local max_live=4 res sample
  command -v wrk >/dev/null || { echo "    wrk is not installed (apt-get install wrk)"; return 1; }
  curl -fs "http://127.0.0.1:$port/run/setup_wrk" >"$run/logs/setup_wrk.log" || return 1
  grep -q '^1 passed, 0 failed$' "$run/logs/setup_wrk.log" || { cat "$run/logs/setup_wrk.log"; return 1; }
  curl -s -m 20 "http://127.0.0.1:$port/app/sample?name=cp-wrk&secs=3" >"$run/logs/wrk_sample.log" &
  local sampler=$!
  sleep 0.2
  wrk -t2 -c50 -d2s "http://127.0.0.1:$port/app/redis_ping?pool=wrk" >"$run/logs/wrk.log" 2>&1
  wait "$sampler"
  sample=$(cat "$run/logs/wrk_sample.log")
  res=$(grep -E 'Requests/sec|Non-2xx|Socket errors|requests in' "$run/logs/wrk.log" | tr -s ' ' | tr '\n' ';')
  echo "    wrk: $res sampler: $sample"
  local max=${sample#max=}; max=${max%% *}
  [ -n "$max" ] && [ "$max" -ge 1 ] && [ "$max" -le "$max_live" ] || return 1
  ! grep -q 'Non-2xx' "$run/logs/wrk.log" || return 1
  grep -q 'requests in' "$run/logs/wrk.log"
}

# The second redis-server (faultctl.sh) from here: start or kill; prints
# its status line.
fault_cmd() {
  local ctl=$run/ctl
  rm -f "$ctl/redis2.status"
  echo "$1" >"$ctl/redis2.cmd.tmp" && mv "$ctl/redis2.cmd.tmp" "$ctl/redis2.cmd"
  for _ in $(seq 1 250); do
    [ -s "$ctl/redis2.status" ] && { cat "$ctl/redis2.status"; return; }
    sleep 0.02
  done
  echo "no answer from faultctl.sh"
}

# Issue 12: wrk against a pool of lua-resty-redis clients (cpngx.driver's
# preset) while the second redis-server is killed for 2 s and started
# again; the pool's create hook counts connection attempts. With the create
# backoff they stay within its bound while redis is down, and no acquire
# outlives its deadline (acquire_timeout 0.5); the same load on a pool with
# create_backoff = false makes far more (cases/check_backoff.lua).
backoff_load() {
  local name out
  command -v wrk >/dev/null || { echo "    wrk is not installed (apt-get install wrk)"; return 1; }
  [ "$(fault_cmd start)" = up ] || { echo "    the second redis-server did not start"; return 1; }
  curl -fs "http://127.0.0.1:$port/run/setup_backoff" >"$run/logs/setup_backoff.log" || return 1
  grep -q '^1 passed, 0 failed$' "$run/logs/setup_backoff.log" || { cat "$run/logs/setup_backoff.log"; return 1; }
  for name in backoff nobackoff; do
    [ "$(fault_cmd start)" = up ] || return 1
    wrk -t2 -c20 -d4s "http://127.0.0.1:$port/app/redis_deadline?pool=$name" >"$run/logs/wrk_$name.log" 2>&1 &
    local w=$!
    sleep 1
    [ "$(fault_cmd kill)" = down ] || { kill "$w"; return 1; }
    curl -fs "http://127.0.0.1:$port/app/mark?name=$name:down" >/dev/null
    sleep 2
    curl -fs "http://127.0.0.1:$port/app/mark?name=$name:up" >/dev/null
    [ "$(fault_cmd start)" = up ] || { kill "$w"; return 1; }
    wait "$w"
    echo "    wrk ($name): $(grep -E 'requests in|Non-2xx' "$run/logs/wrk_$name.log" | tr -s ' ' | tr '\n' ';')"
  done
  fault_cmd kill >/dev/null
  out=$(curl -s -m 30 "http://127.0.0.1:$port/run/check_backoff")
  echo "$out" | sed 's/^/    /'
  echo "$out" | grep -q '^2 passed, 0 failed$'
}

# After the reload (exiting case), the old worker must be gone soon, though
# its pool had a timer task waiting on a long deadline.
old_worker_gone() {
  local i
  for i in $(seq 1 50); do
    if ! ps -o args= --ppid "$master_pid" 2>/dev/null | grep -q 'shutting down'; then return 0; fi
    sleep 0.1
  done
  ps -o pid=,args= --ppid "$master_pid"
  return 1
}

for c in "${cases[@]}"; do
  if [ "$c" = exiting ] && { [ $# -eq 0 ] || [ "${WITH_LOAD:-0}" = 1 ]; }; then
    check "wrk -c50 against one pool: redis never sees more than max_live connections" wrk_load
    check "wrk -c20 while redis is killed for 2 s: create attempts within the backoff's bound, no acquire past its deadline" backoff_load
  fi
  run_case "$c"
  if [ "$c" = exiting ]; then
    check "the exiting worker is gone within 5 s of the reload" old_worker_gone
  fi
done

# make demo's gateway, briefly (examples/gateway/run.sh, its own nginx and
# redis): the clientpool row stays within its cap (4 workers x 8), no
# request fails, the picture is written.
demo_smoke() {
  local row max errs
  DEMO_SECS=1 "$root/examples/gateway/run.sh" >"$run/logs/demo.log" 2>&1 ||
    { tail -20 "$run/logs/demo.log" | sed 's/^/    /'; return 1; }
  local frow fmax ferrs
  row=$(grep '^| clientpool: cpngx.driver' "$run/logs/demo.log")
  frow=$(grep '^| clientpool on a fleet' "$run/logs/demo.log")
  echo "    $row"
  echo "    $frow"
  max=$(echo "$row" | awk -F'|' '{ gsub(/ /, "", $3); print $3 }')
  errs=$(echo "$row" | awk -F'|' '{ gsub(/ /, "", $7); print $7 }')
  fmax=$(echo "$frow" | awk -F'|' '{ gsub(/ /, "", $3); print $3 }')
  ferrs=$(echo "$frow" | awk -F'|' '{ gsub(/ /, "", $7); print $7 }')
  [ -n "$max" ] && [ "$max" -ge 1 ] && [ "$max" -le 32 ] && [ "$errs" = 0 ] &&
    [ -n "$fmax" ] && [ "$fmax" -ge 1 ] && [ "$fmax" -le 8 ] && [ "$ferrs" = 0 ] &&
    grep -q '</svg>' "$root/build/demo/connections.svg"
}
if [ $# -eq 0 ]; then
  check "make demo's gateway (1 s per configuration): clientpool within 32 connections, on the fleet within 8, no errors, the SVG written" \
    demo_smoke
fi

check "promtool check metrics accepts the recipe's /metrics (three workers)" metrics_promtool
check "the metrics nginx stops at once (QUIT), nothing in its error.log but the killed worker" metrics_nginx_stops

# nginx must not have crashed or logged alerts
if grep -E '\[(alert|emerg)\]|exited on signal' "$run/error.log" >"$run/logs/alerts.log"; then
  echo "[external] not ok - error.log has alerts or crashes:"
  sed 's/^/    /' "$run/logs/alerts.log" | head -20
  failed=$((failed + 1))
else
  echo "[external] ok - no alerts or crashes in error.log"
  passed=$((passed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
