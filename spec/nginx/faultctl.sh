#!/usr/bin/env bash
# spec/nginx/faultctl.sh - started by spec/nginx/run.sh in the background:
# carries out the fault actions nginx cases ask for. A case cannot start a
# server itself: a process forked by an nginx worker inherits the worker's
# sockets (listeners, client and upstream connections), which would then
# outlive their close in nginx.
#
# usage: faultctl.sh RUN_DIR REDIS_SERVER PORT
#
# A case writes a command to RUN_DIR/ctl/redis2.cmd (cases/redis_restart.lua); this
# script removes the command file, carries it out and writes the outcome to
# RUN_DIR/ctl/redis2.status:
#   start   start a second redis-server on PORT (no persistence), wait until
#           it answers PING; status "up" (or "error ...")
#   kill    SIGKILL it (a crash: its clients' connections are reset), wait
#           until it is gone; status "down"
# Polls every 20 ms. On TERM/INT/EXIT, or once run.sh is gone, it kills that
# redis-server and ends.
set -u
run=$1 redis_bin=$2 port=$3
parent=$PPID
ctl=$run/ctl
pidf=$run/redis2.pid
mkdir -p "$ctl" || exit 1
exec 2>>"$run/faultctl.log"   # (bash reports each killed redis-server there)
pid=

stop_redis() {
  local p=${pid:-$(cat "$pidf" 2>/dev/null)}
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill -KILL "$p" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.02; done
  fi
  wait 2>/dev/null
  pid=
}

finish() {
  trap - EXIT TERM INT
  stop_redis
  exit 0
}
trap finish EXIT TERM INT

start_redis() {
  stop_redis
  "$redis_bin" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --pidfile "$pidf" --logfile "$run/redis2.log" --dir "$run" </dev/null >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && { status=up; return; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  status="error: redis-server did not answer on $port (see $run/redis2.log)"
}

while kill -0 "$parent" 2>/dev/null; do
  if [ -f "$ctl/redis2.cmd" ]; then
    cmd=$(cat "$ctl/redis2.cmd")
    # removed before the status is written: a case may send its next
    # command as soon as it reads the status
    rm -f "$ctl/redis2.cmd"
    case $cmd in
      start) start_redis ;;
      kill) stop_redis; status=down ;;
      *) status="error: unknown command '$cmd'" ;;
    esac
    echo "$status" >"$ctl/redis2.status.tmp" && mv "$ctl/redis2.status.tmp" "$ctl/redis2.status"
  fi
  sleep 0.02
done
