# scripts/servers.sh - sourced (bash) by bench/nginx/run.sh and
# examples/gateway/run.sh (make demo): a private redis-server and nginx on
# 127.0.0.1, everything under the run dir $run, stopped by pid.
#
# Expects: $run (the run dir), $nginx_bin, $redis_bin, and a die function.
#   free_port                 a free loopback port (bind port 0, read it back)
#   lua_conf NAME KEY=VALUE... writes $run/NAME.lua: return { KEY = VALUE, ... }
#                             (values are Lua expressions: numbers here)
#   redis_start PORT          redis-server, no persistence, daemonized
#                             ($run/redis.pid, $run/redis.log); waits for PONG
#   redis_stop                TERM by pid, KILL after 5 s
#   redis_quiet PORT          waits (5 s at most) until redis sees no client
#                             but redis-cli (the previous nginx is gone)
#   nginx_start PORT          nginx -p $run -c $run/nginx.conf; waits until
#                             http://127.0.0.1:PORT/ping answers
#   nginx_stop                TERM by the master's pid, KILL (workers too) after 5 s
#   need_tools [NAME...]      dies unless nginx with the Lua module, redis-server,
#                             redis-cli, curl, lua5.1 with LuaSocket, the LuaJIT
#                             build of clientpool and each NAME are there
#   nginx_preamble DIR WORKERS LOGLEVEL CONNECTIONS
#                             an nginx.conf's main context for DIR (modules,
#                             pid, error log, events)
#   nginx_temp_paths DIR      nginx's temp path lines for DIR/tmp (an http block's)
#   nginx_conf WORKERS PORT LUA_DIR < LOCATIONS
#                             writes $run/nginx.conf: one server on
#                             127.0.0.1:PORT with /ping and the location
#                             lines read from stdin, Lua modules from LUA_DIR,
#                             $NGINX_HTTP_EXTRA (if set) at the http level,
#                             lua/ and build/luajit ($root: the repository)

lua_conf() {
  local name=$1 kv
  shift
  {
    echo "-- written by ${0#$root/}"
    echo "return {"
    for kv in "$@"; do echo "  ${kv%%=*} = ${kv#*=},"; done
    echo "}"
  } >"$run/$name.lua"
}

need_tools() {
  local mods=${NGINX_MODULES:-/usr/lib/nginx/modules} t
  command -v "$nginx_bin" >/dev/null || die "no nginx ($nginx_bin): scripts/deps.sh installs it"
  command -v "$redis_bin" >/dev/null || die "no redis-server ($redis_bin): scripts/deps.sh installs it"
  for t in curl redis-cli lua5.1 "$@"; do command -v "$t" >/dev/null || die "no $t: scripts/deps.sh installs it"; done
  lua5.1 -e 'require "socket"' 2>/dev/null || die "no LuaSocket for lua5.1 (lua-socket)"
  [ -f "$mods/ngx_http_lua_module.so" ] || die "no $mods/ngx_http_lua_module.so (libnginx-mod-http-lua)"
  [ -f "$root/build/luajit/clientpool/core.so" ] || die "build/luajit/clientpool/core.so missing: run make"
}

free_port() {
  lua5.1 -e 'local s = assert(require("socket").bind("127.0.0.1", 0)); local _, p = s:getsockname(); print(p); s:close()'
}

redis_start() {
  local port=$1
  "$redis_bin" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$run/redis.pid" --logfile "$run/redis.log" --dir "$run" \
    || die "redis-server did not start (see $run/redis.log)"
  for _ in $(seq 1 50); do
    [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && return 0
    sleep 0.1
  done
  die "redis-server does not answer on $port"
}

redis_stop() {
  local pid
  pid=$(cat "$run/redis.pid" 2>/dev/null)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  return 0
}

redis_quiet() {
  local port=$1
  for _ in $(seq 1 50); do
    [ "$(redis-cli -p "$port" info clients 2>/dev/null | tr -d '\r' | sed -n 's/^connected_clients://p')" = 1 ] &&
      return 0
    sleep 0.1
  done
  echo "redis still has clients: $(redis-cli -p "$port" client list 2>/dev/null | wc -l)" >&2
}

nginx_start() {
  local port=$1
  "$nginx_bin" -p "$run" -c "$run/nginx.conf" -e "$run/error.log" 2>"$run/nginx.start.log" ||
    { cat "$run/nginx.start.log" >&2; die "nginx did not start"; }
  for _ in $(seq 1 50); do
    [ -s "$run/nginx.pid" ] && curl -fs "http://127.0.0.1:$port/ping" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  tail -20 "$run/error.log" >&2
  die "nginx does not answer on $port"
}

nginx_stop() {
  local pid workers
  pid=$(cat "$run/nginx.pid" 2>/dev/null)
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    workers=$(ps -o pid= --ppid "$pid" 2>/dev/null)
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "nginx did not stop in 5 s: killing master $pid and workers" $workers >&2
      kill -KILL "$pid" $workers 2>/dev/null
    fi
  fi
  rm -f "$run/nginx.pid"
}

nginx_temp_paths() {
  local dir=$1
  printf '  %s_temp_path %s;\n' client_body "$dir/tmp/body" proxy "$dir/tmp/proxy" fastcgi "$dir/tmp/fastcgi" \
    uwsgi "$dir/tmp/uwsgi" scgi "$dir/tmp/scgi"
}

nginx_preamble() {
  local dir=$1 workers=$2 level=$3 conns=$4 mods=${NGINX_MODULES:-/usr/lib/nginx/modules}
  cat <<EOF
load_module $mods/ndk_http_module.so;
load_module $mods/ngx_http_lua_module.so;
worker_processes $workers;
pid $dir/nginx.pid;
error_log $dir/error.log $level;
events { worker_connections $conns; }
EOF
}

nginx_conf() {
  local workers=$1 port=$2 luadir=$3
  {
    echo "# written by ${0#$root/}"
    nginx_preamble "$run" "$workers" warn 4096
    cat <<EOF

http {
  access_log off;
$(nginx_temp_paths "$run")

  lua_package_path "$luadir/?.lua;$root/lua/?.lua;$root/lua/?/init.lua;$run/?.lua;;";
  lua_package_cpath "$root/build/luajit/?.so;;";
${NGINX_HTTP_EXTRA:+  $NGINX_HTTP_EXTRA}

  server {
    listen 127.0.0.1:$port;
    location = /ping { return 200 "pong\n"; }
EOF
    sed 's/^/    /'
    echo "  }"
    echo "}"
  } >"$run/nginx.conf"
}
