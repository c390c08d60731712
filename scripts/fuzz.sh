#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": Clang, ASan + UBSan) and runs
# each for a bounded time on a scratch copy of its seed corpus, so the
# checkout is never written to. Fails if any target finds a crash, a leak, a
# slow input or an out-of-memory.
#
#   FUZZ_SECONDS=300 bash scripts/fuzz.sh     # longer run (default 30 s each)
#   bash scripts/fuzz.sh probe                # only some targets
#
# Needs clang-14 and libclang-rt-14-dev (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv/bin ] && export PATH="$PWD/.venv/bin:$PATH"

seconds="${FUZZ_SECONDS:-30}"
targets=("$@")
((${#targets[@]})) || targets=(classifier rules_file probe)

echo "== building fuzz targets"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j2

# Readable stack traces when LLVM's symbolizer is installed.
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && [ -x /usr/lib/llvm-14/bin/llvm-symbolizer ]; then
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

work="$(mktemp -d -t mineru-health-fuzz.XXXXXX)"
failed=()
for target in "${targets[@]}"; do
  binary="build/fuzz/${target}_fuzz"
  [ -x "$binary" ] || { echo "no such fuzz target: $target" >&2; exit 2; }
  mkdir -p "$work/$target/corpus" "$work/$target/artifacts"
  cp -R "cpp/fuzz/corpus/$target/." "$work/$target/corpus/"
  echo "== fuzzing $target for ${seconds}s"
  # -timeout: one input may take at most 25 s (a hang would otherwise outlast
  # max_total_time, which is only checked between inputs). An eighth of the
  # usual stack: inputs stop at 64 KB but real ones reach 16 MiB, so recursion
  # as deep as the input must overflow here rather than in production.
  if ! (ulimit -s 1024
        exec "$binary" -max_total_time="$seconds" -max_len=65536 \
          -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
          -artifact_prefix="$work/$target/artifacts/" \
          "$work/$target/corpus") >"$work/$target/log" 2>&1; then
    failed+=("$target")
    tail -n 60 "$work/$target/log"
    echo "!! $target failed; reproducer(s):" "$work/$target/artifacts/"*
  else
    grep -E '^stat::number_of_executed_units|^Done' "$work/$target/log" || true
  fi
done

if ((${#failed[@]})); then
  # Keep the scratch dir: it holds the crashing inputs and full logs.
  echo "== fuzzing failed: ${failed[*]} (logs and inputs in $work)" >&2
  exit 1
fi
rm -rf "$work"
echo "== fuzzing passed: ${targets[*]}"
