#!/usr/bin/env bash
# Runs "$@" without the descriptors above 2 its parent left open. The
# spec's sockets (its connection sampling the target's INFO clients) would
# otherwise live on in every member and redis-server it starts, and the
# target would count one connection more once the spec reopened its own.
for f in /proc/$$/fd/*; do
  n=${f##*/}
  if [ "$n" -gt 2 ]; then eval "exec $n>&-"; fi
done 2>/dev/null
exec "$@"
