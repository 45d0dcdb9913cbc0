#!/usr/bin/env bash
# scripts/deps.sh - make sure every Debian package the build and tests need
# is installed (see ENVIRONMENT.md in the project's shared notes).
#
# Fast path: one dpkg-query, no apt call at all, when everything is present.
# Missing packages: as root, `apt-get update` once and install them; as
# another user, print the exact command to run and exit 1.
#
# Never add `luajit` or `libluajit-5.1-dev`: they conflict with
# libnginx-mod-http-lua's LuaJIT (luajit2) and apt refuses the whole install.
set -euo pipefail

PACKAGES=(
  # PUC Lua interpreters and headers
  lua5.1 lua5.2 lua5.3 lua5.4 liblua5.1-0-dev liblua5.2-dev liblua5.3-dev liblua5.4-dev
  # OpenResty's LuaJIT fork (provides /usr/bin/luajit, /usr/include/luajit-2.1)
  luajit2 libluajit2-5.1-dev
  # nginx with the Lua module
  nginx libnginx-mod-http-lua lua-resty-core lua-resty-lrucache
  # test tools
  lua-busted lua-check
  # host schedulers
  lua-cqueues lua-luv lua-socket lua-copas
  # upstreams used by integration specs
  redis-server redis-tools curl wrk
  # real drivers: lua-resty-redis (installed as nginx/redis.lua)
  lua-nginx-redis
  # clientpool.http (lua-http on cqueues, Lua 5.1/LuaJIT) and its specs'
  # TLS certificate (made at test time); clientpool.metrics: promtool and a
  # Prometheus server scraping a test endpoint
  lua-http openssl prometheus
  # packaging
  luarocks
  # C tooling; llvm-14 gives llvm-symbolizer for readable ASan reports
  # (a Recommends of clang-14, so --no-install-recommends would skip it)
  gcc make clang-14 libclang-rt-14-dev llvm-14 valgrind pkg-config
)

missing=()
# One dpkg-query for all packages; unknown ones make it exit non-zero and
# print nothing for them, so compare by name rather than trusting the status.
installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PACKAGES[@]}" 2>/dev/null || true)
for p in "${PACKAGES[@]}"; do
  if ! grep -qE "^${p//./\\.} ii" <<<"$installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  [ "${DEPS_QUIET:-0}" = 1 ] || echo "deps: all ${#PACKAGES[@]} packages installed"
  exit 0
fi

echo "deps: missing packages: ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: run as root, or:" >&2
  echo "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}"
echo "deps: installed ${missing[*]}"
