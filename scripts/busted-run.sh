#!/usr/bin/env bash
# scripts/busted-run.sh - run busted under one interpreter and end with a
# machine-readable line "<N> passed, <M> failed".
#
# usage: scripts/busted-run.sh LUA [busted options...] [ROOT...]
#   LUA      the interpreter (lua5.1, lua5.2, lua5.3, lua5.4, luajit, or a path)
#   options  passed to busted as is; write them as --opt=value (one word), so
#            the words that do not start with '-' are the ROOTs
#   ROOT     spec directories or files (default: spec)
#
# environment:
#   BUSTED          path of the busted script (default: /usr/bin/busted)
#   BUSTED_LOG      also keep busted's output in this file
#   BUSTED_PREFIX   command words put before LUA (e.g. "valgrind ...")
#
# Busted's summary line "X successes / Y failures / Z errors / W pending"
# becomes "X passed, Y+Z failed".  Exit status is non-zero when a test
# failed or errored, when busted exited non-zero, when it printed no summary
# (crash), or when it ran no test although spec files exist.  A root that
# holds no spec file at all is reported as "0 passed, 0 failed" and passes.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 LUA [busted options...] [ROOT...]" >&2
  exit 2
fi
lua=$1; shift
busted=${BUSTED:-/usr/bin/busted}

roots=()
pattern=_spec
for a in "$@"; do
  case $a in
    --pattern=*) pattern=${a#--pattern=} ;;
    -*) ;;
    *) roots+=("$a") ;;
  esac
done
[ ${#roots[@]} -gt 0 ] || roots=(spec)

# Count the spec files busted would load (its default: Lua files whose name
# matches the pattern, recursively).  Busted's pattern is a Lua pattern; the
# default _spec is also a plain substring, which is what we match here.
nspec=0
for r in "${roots[@]}"; do
  if [ -f "$r" ]; then
    nspec=$((nspec + 1))
  elif [ -d "$r" ]; then
    n=$(find "$r" -type f -name "*${pattern}*.lua" | wc -l)
    nspec=$((nspec + n))
  fi
done

label="busted ($lua)"
if [ "$nspec" -eq 0 ]; then
  echo "$label: no spec files under ${roots[*]}"
  echo "0 passed, 0 failed"
  exit 0
fi

out=$(mktemp)
crumb=$(mktemp)
trap 'rm -f "$out" "$crumb"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
# A crash leaves a core file here (where the kernel's core_pattern is a
# plain name) for the backtrace printed below.
ulimit -c unlimited 2>/dev/null || true
started=$(date +%s)
# -o busted_crumbs.lua: plainTerminal's output (a stable summary line without
# colours whatever .busted says), and the test under way kept in $crumb.
# shellcheck disable=SC2086
BUSTED_CRUMB=$crumb ${BUSTED_PREFIX:-} "$lua" "$busted" -o "$here/busted_crumbs.lua" "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ -z "${BUSTED_LOG:-}" ] || cp "$out" "$BUSTED_LOG"

# Last summary line, ANSI escapes stripped.
summary=$(sed -E 's/\x1b\[[0-9;]*m//g' "$out" |
  grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' | tail -n 1)

if [ -z "$summary" ]; then
  echo "$label: no summary line from busted (exit status $rc): crashed, failed to start, or a sanitizer ended it"
  [ ! -s "$crumb" ] || echo "$label: it ended during: $(cat "$crumb")"
  # the interpreter's backtrace, when it dumped a core here and gdb is installed
  core=$(find . -maxdepth 1 -name 'core*' -type f -newermt "@$started" 2>/dev/null | head -n 1)
  if [ -n "$core" ]; then
    if command -v gdb >/dev/null; then
      gdb -batch -q -ex 'bt 40' "$(command -v "$lua" || echo "$lua")" "$core" 2>&1 | tail -n 45
    fi
    rm -f "$core"
  fi
  echo "0 passed, 1 failed"
  exit 1
fi

read -r ok fail err pend <<<"$(sed -E 's#^([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+) .*#\1 \2 \3 \4#' <<<"$summary")"
failed=$((fail + err))
status=0
if [ "$failed" -ne 0 ]; then
  status=1
elif [ "$rc" -ne 0 ]; then
  echo "$label: busted exited with status $rc"
  failed=1; status=1
elif [ "$ok" -eq 0 ]; then
  echo "$label: $nspec spec file(s) but no test ran"
  failed=1; status=1
fi
[ "$pend" -eq 0 ] || echo "$label: $pend pending"
echo "$ok passed, $failed failed"
exit $status
