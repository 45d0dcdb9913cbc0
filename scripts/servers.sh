# scripts/servers.sh - sourced (bash) by bench/nginx/run.sh and
# examples/gateway/run.sh (make demo): a private redis-server and nginx on
# 127.0.0.1, everything under the run dir $run, stopped by pid.
#
# Expects: $run (the run dir), $nginx_bin, $redis_bin, and a die function.
#   free_port                 a free loopback port (bind port 0, read it back)
#   redis_start PORT          redis-server, no persistence, daemonized
#                             ($run/redis.pid, $run/redis.log); waits for PONG
#   redis_stop                TERM by pid, KILL after 5 s
#   redis_quiet PORT          waits (5 s at most) until redis sees no client
#                             but redis-cli (the previous nginx is gone)
#   nginx_start PORT          nginx -p $run -c $run/nginx.conf; waits until
#                             http://127.0.0.1:PORT/ping answers
#   nginx_stop                TERM by the master's pid, KILL (workers too) after 5 s
#   nginx_conf_head WORKERS   the first lines of an nginx.conf for $run (modules,
#                             pid, error log, events, temp paths: close the
#                             http block yourself)

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

nginx_conf_head() {
  local mods=${NGINX_MODULES:-/usr/lib/nginx/modules}
  cat <<EOF
load_module $mods/ndk_http_module.so;
load_module $mods/ngx_http_lua_module.so;

worker_processes $1;
pid $run/nginx.pid;
error_log $run/error.log warn;

events { worker_connections 4096; }

http {
  access_log off;
  client_body_temp_path $run/tmp/body;
  proxy_temp_path $run/tmp/proxy;
  fastcgi_temp_path $run/tmp/fastcgi;
  uwsgi_temp_path $run/tmp/uwsgi;
  scgi_temp_path $run/tmp/scgi;
EOF
}
