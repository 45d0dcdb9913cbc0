#!/usr/bin/env bash
# scripts/fuzz.sh - run the engine fuzzer (spec/c/fuzz_engine.c: the engine
# against the reference model spec/c/model.c) for a bounded time.
#
# usage: scripts/fuzz.sh BIN SECONDS [extra libFuzzer flags...]
#        scripts/fuzz.sh BIN merge
#
#   SECONDS  first replays every regression input (spec/c/regress/) once,
#            then fuzzes for SECONDS over the committed seed corpus
#            (spec/c/corpus/fuzz_engine/) and the regressions.  New inputs go
#            to build/fuzz/corpus (kept between runs, never committed by
#            this script); a crash is written to build/fuzz/artifacts/.
#   merge    rewrites the committed seed corpus as a minimal set (by coverage
#            edges) of itself and the inputs of build/fuzz/corpus.
#
# The libFuzzer log is build/fuzz/fuzz.log; the script prints one summary
# line, or on a failure the end of the log and how to reproduce it.
set -uo pipefail
bin=$1; mode=$2; shift 2
corpus=spec/c/corpus/fuzz_engine
regress=spec/c/regress
out=build/fuzz
log=$out/fuzz.log
mkdir -p "$out/corpus" "$out/artifacts" "$corpus"

if [ "$mode" = merge ]; then
  # A fresh minimal set over the seed corpus and the new inputs, by coverage
  # edges only (-use_counters=0: hit counts would keep nearly every input),
  # so the committed corpus stays small as the harness changes.
  before=$(find "$corpus" -type f | wc -l)
  tmp=$out/merged
  rm -rf "$tmp"; mkdir -p "$tmp"
  "$bin" -merge=1 -use_counters=0 "$tmp" "$corpus" "$out/corpus" >"$log" 2>&1 || { tail -n 30 "$log"; exit 1; }
  rm -f "$corpus"/*
  cp "$tmp"/* "$corpus"/
  after=$(find "$corpus" -type f | wc -l)
  echo "fuzz-merge: seed corpus $before -> $after inputs ($corpus, minimal by edges)"
  exit 0
fi

fail() {
  echo "fuzz: FAILED ($1); last lines of $log:"
  grep -v '^#[0-9]' "$log" | tail -n 40
  crash=$(ls -t "$out"/artifacts/* 2>/dev/null | head -n 1)
  if [ -n "$crash" ]; then
    echo "fuzz: reproduce with: FUZZ_TRACE=1 $bin $crash"
    echo "fuzz: once fixed, keep it: cp $crash $regress/<name>"
  fi
  exit 1
}

# 1. every regression input, once
nreg=0
if [ -d "$regress" ] && [ -n "$(ls -A "$regress" 2>/dev/null)" ]; then
  nreg=$(find "$regress" -type f | wc -l)
  "$bin" "$regress"/* >"$log" 2>&1 || fail "a regression input fails"
fi

# 2. a bounded run over the seed corpus and the regressions
"$bin" -max_total_time="$mode" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$out/artifacts/" "$@" "$out/corpus" "$corpus" "$regress" >"$log" 2>&1 ||
  fail "the engine and the model disagree, an invariant broke, or a sanitizer fired"

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1)
nseed=$(find "$corpus" -type f | wc -l)
echo "fuzz: ok: $nreg regression inputs replayed; ${execs:-?} runs (at most ${mode}s, ${rate:-?}/s) from $nseed seed inputs; ${cov:-}"
