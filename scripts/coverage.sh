#!/usr/bin/env bash
# scripts/coverage.sh - branch coverage of csrc/engine.c from the C tests
# (spec/c/test_engine.c and spec/c/test_engine_*.c) and the lua5.4 busted specs
# (`make coverage`).
#
# gcc --coverage, everything under build/cov.  The engine is compiled once,
# through spec/c/whitebox.c (csrc/engine.c unchanged, allocation-failure
# injection left disarmed outside the tests that arm it), and that one object
# is linked into both the C test runner and the lua5.4 module, so a single
# .gcda adds up both runs.  Prints the branch coverage of csrc/engine.c
# ("taken at least once", as gcov -b counts it) and fails below COVERAGE_MIN
# percent (default 95).  The annotated source is build/cov/engine.c.gcov:
# untaken branches show as "taken 0" or "never executed".
#
# environment: CC (default gcc), GCOV (default gcov), COVERAGE_MIN
set -uo pipefail
cc=${CC:-gcc}
gcov=${GCOV:-gcov}
min=${COVERAGE_MIN:-95}
root=$(pwd)
out=build/cov
rm -rf "$out"
mkdir -p "$out/obj" "$out/lua5.4/clientpool"

# absolute source paths: gcov finds the sources from build/cov
flags=(-std=c11 -O0 -g -fPIC --coverage -I"$root/csrc")
set -e
"$cc" "${flags[@]}" -c "$root/spec/c/whitebox.c" -o "$out/obj/whitebox.o"
"$cc" "${flags[@]}" -c "$root/csrc/clock.c" -o "$out/obj/clock.o"
# the module's other sources (engine.c comes in through whitebox.c)
binding=()
for src in lclientpool lfastpath fleet lfleet; do
  "$cc" "${flags[@]}" -I/usr/include/lua5.4 -c "$root/csrc/$src.c" -o "$out/obj/$src.o"
  binding+=("$out/obj/$src.o")
done
"$cc" "${flags[@]}" "$root"/spec/c/test_engine.c "$root"/spec/c/test_engine_*.c "$out/obj/whitebox.o" "$out/obj/clock.o" \
  "$out/obj/fleet.o" -lm -o "$out/test_engine"
"$cc" -shared --coverage -o "$out/lua5.4/clientpool/core.so" \
  "$out/obj/whitebox.o" "$out/obj/clock.o" "${binding[@]}" -lm
set +e

echo "coverage: C tests: $("$out/test_engine" | tail -n 1)"
busted=$(CLIENTPOOL_BACKEND=core scripts/busted-run.sh lua5.4 '--lpath=./lua/?.lua;./lua/?/init.lua' \
  "--cpath=./$out/lua5.4/?.so" spec 2>&1 | tail -n 1)
echo "coverage: lua5.4 specs: $busted"

(cd "$out" && "$gcov" -b -c -o obj "$root/spec/c/whitebox.c") >"$out/gcov.txt" 2>&1
# gcov's summary block of the engine source
block=$(awk '/^File .*csrc\/engine\.c/{on=1; next} on && /^File /{on=0} on' "$out/gcov.txt")
taken=$(sed -n 's/^Taken at least once:\([0-9.]*\)% of \([0-9]*\)/\1 \2/p' <<<"$block")
lines=$(sed -n 's/^Lines executed:\([0-9.]*\)% of \([0-9]*\)/\1 \2/p' <<<"$block")
if [ -z "$taken" ]; then
  echo "coverage: no branch data for csrc/engine.c (see $out/gcov.txt)"
  exit 1
fi
read -r pct nbr <<<"$taken"
read -r lpct nlines <<<"$lines"
gcovfile=$(ls "$out"/*engine.c.gcov 2>/dev/null | head -n 1)
[ -z "$gcovfile" ] || [ "$gcovfile" = "$out/engine.c.gcov" ] || mv "$gcovfile" "$out/engine.c.gcov"
untaken=$(grep -cE '^branch +[0-9]+ (taken 0|never executed)' "$out/engine.c.gcov" 2>/dev/null || echo '?')
echo "coverage: csrc/engine.c branches taken: ${pct}% of ${nbr} (${untaken} not taken); lines: ${lpct}% of ${nlines}"
echo "coverage: annotated source: $out/engine.c.gcov"
if awk -v p="$pct" -v m="$min" 'BEGIN { exit !(p + 0 < m + 0) }'; then
  echo "coverage: below COVERAGE_MIN=${min}%"
  exit 1
fi
