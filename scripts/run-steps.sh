#!/usr/bin/env bash
# scripts/run-steps.sh - run make targets one after another, keep going after
# a failure, and end with one overall line.
#
# usage: MAKE=make scripts/run-steps.sh STEP...
#
# Each step's output is shown and kept in build/logs/STEP.log.  A step that
# prints "<N> passed, <M> failed" (C tests, busted wrapper) adds to the
# totals; any step counts as failed when its exit status is non-zero.
set -uo pipefail
make_cmd=${MAKE:-make}
mkdir -p build/logs

total_pass=0 total_fail=0
summary=() failed_steps=()
for step in "$@"; do
  log=build/logs/$step.log
  echo
  echo "=== $step"
  $make_cmd --no-print-directory "$step" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  line=$(sed -E 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -n "$line" ]; then
    read -r p _ f _ <<<"$line"
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
    res="$p passed, $f failed"
  else
    res="no counts"
  fi
  if [ "$rc" -ne 0 ]; then
    failed_steps+=("$step")
    summary+=("$(printf '  %-20s FAIL (exit %d; %s)' "$step" "$rc" "$res")")
  else
    summary+=("$(printf '  %-20s ok   (%s)' "$step" "$res")")
  fi
done

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed_steps[@]} -eq 0 ]; then
  echo "ALL OK: $total_pass passed, $total_fail failed in $# steps"
  exit 0
fi
# What failed, at the end where a truncated CI log still shows it: busted's
# "Failure ->"/"Error ->" headings with the two lines after each, else the
# step's last lines.
for step in "${failed_steps[@]}"; do
  log=build/logs/$step.log
  echo
  echo "=== what failed in $step (build/logs/$step.log)"
  clean=$(sed -E 's/\x1b\[[0-9;]*m//g' "$log")
  if grep -qE '^(Failure|Error) ->' <<<"$clean"; then
    grep -E -A2 '^(Failure|Error) ->' <<<"$clean" | head -n 24
  else
    tail -n 8 <<<"$clean"
  fi
done
echo
echo "FAILED: $total_pass passed, $total_fail failed; failed steps: ${failed_steps[*]}"
exit 1
