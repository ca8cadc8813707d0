#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: the gpu tests, the rest of the test suite and
# every GPU benchmark, their tables in one Markdown report, and exit code 1 if any failed.
# See docs/benchmarks.md ("One command on a GPU machine").
#
#   bench/gpu.sh             all steps (about 20 minutes on one H100 or H200)
#   bench/gpu.sh 1           part 1 of 3: gpu-tests, suite
#   bench/gpu.sh 2           part 2 of 3: throughput, precision, syncs
#   bench/gpu.sh 3           part 3 of 3: memory, kernels, dataloader, micro-batch
#   bench/gpu.sh quick       one call of 8 to 10 minutes, for a 15-minute device budget: gpu-tests,
#                            syncs, kernels (ce, lce, fp8) and throughput (amp, amp+channels_last;
#                            30 steps), each step bounded (240, 50, 120, 165 s; GPU_STEP_TIMEOUT
#                            sets one bound for all)
#   bench/gpu.sh kernels     named steps, in the order given
#   bench/gpu.sh report      only rebuild gpu-report.md from the steps' files (no GPU needed)
#   bench/gpu.sh --list      the steps and their commands
#
# Results go to $GPU_RESULTS, else $OUT (the device tool's folder), else outputs/gpu-results: one
# <n>-<step>.md per step (first line: its status; then its table, or the tail of its output
# when it failed) and gpu-report.md, which joins every step file found there. A step whose
# file says "ok" is skipped (GPU_FORCE=1 runs it again), so an interrupted run resumes, and
# parts run in separate calls add up to one report when they share the folder. With
# GPU_RESULTS set and OUT set too, the files are also copied to $OUT at the end.
#
# Setup, before the first GPU step, downloads nothing: the wheels in $WHEELS (default .whl/,
# else ../shared/wheels/: hydra-core, omegaconf, antlr4) and this checkout are installed into
# the Python that runs (`pip --no-index --no-deps`, the checkout editable, so the `tuneup`
# entry points that find the built-in plugins exist); torch, triton and Lightning are the
# machine's own. PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
RESULTS=${GPU_RESULTS:-${OUT:-outputs/gpu-results}}
LOGS=${GPU_LOGS:-/tmp/tuneup-gpu-logs}
STEP_TIMEOUT=${GPU_STEP_TIMEOUT:-900}
export PYTHONUNBUFFERED=1
export PIP_NO_INDEX=1  # no registry here: the test that pip-installs an old Triton skips at once

STEPS=(gpu-tests suite throughput precision memory kernels dataloader syncs micro-batch)
PART_1=(gpu-tests suite)
PART_2=(throughput precision syncs)
PART_3=(memory kernels dataloader micro-batch)
PART_QUICK=(gpu-tests syncs kernels throughput)
QUICK=0  # 1: the quick part's shorter throughput and kernels commands

xdist() {  # pytest-xdist's "-n N" where it is installed (the GPU images have it); else no
  # addopts, whose "-n 2" (pyproject.toml) needs it
  if "$PY" -c "import xdist" 2>/dev/null; then echo "-n $1"; else echo "-o addopts="; fi
}

command_of() {  # the command of one step
  case $1 in
    gpu-tests) echo "$PY -m pytest tests -m gpu -q -rfEs -p no:cacheprovider $(xdist 8)" ;;
    suite) echo "$PY -m pytest tests -m 'not gpu' -q -rfEs $(xdist 14)" ;;
    throughput)
      if [[ $QUICK == 1 ]]; then
        echo "$PY bench/throughput.py --configs amp,amp+channels_last --data loader,on_device --steps 30 --warmup 10"
      else
        echo "$PY bench/throughput.py --steps 40 --warmup 15"
      fi ;;
    precision) echo "$PY bench/precision.py --steps 30 --warmup 10" ;;
    memory) echo "$PY bench/memory.py --device cuda --steps 10 --warmup 2" ;;
    kernels)  # the optim section alone took more than a minute on an H200 (2026-11-27)
      if [[ $QUICK == 1 ]]; then echo "$PY bench/kernels.py --only ce,lce,fp8"; else echo "$PY bench/kernels.py"; fi ;;
    dataloader) echo "$PY bench/dataloader.py --model resnet50 --image-size 224 --steps 30" ;;
    # host-device syncs per step (set_sync_debug_mode): tuneup's must be 0 outside logging steps
    syncs) echo "$PY bench/syncs.py && $PY bench/syncs.py model=mlp precision=bf16" ;;
    # grad_accum.micro_batch_size=auto: a GPT batch too large for the GPU, found by halving
    micro-batch) echo "$PY bench/micro_batch.py --batch 512 --steps 4" ;;
  esac
}

timeout_of() {  # seconds a step may run: GPU_STEP_TIMEOUT, else the quick part's own, else 900
  if [[ -n ${GPU_STEP_TIMEOUT:-} || $QUICK != 1 ]]; then echo "$STEP_TIMEOUT"; return; fi
  case $1 in gpu-tests) echo 240 ;; syncs) echo 50 ;; kernels) echo 120 ;; throughput) echo 165 ;;
    *) echo "$STEP_TIMEOUT" ;; esac
}

number_of() {  # 1-based position of a step in STEPS, for the files' order
  local i
  for i in "${!STEPS[@]}"; do [[ ${STEPS[$i]} == "$1" ]] && echo $((i + 1)); done
}

file_of() { echo "$RESULTS/$(number_of "$1")-$1.md"; }

setup() {
  "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || {
    echo "bench/gpu.sh: torch sees no CUDA GPU here ($PY); nothing to run" >&2
    exit 2
  }
  local wheels=${WHEELS:-}
  if [[ -z $wheels ]]; then
    if compgen -G ".whl/*.whl" >/dev/null; then wheels=.whl; else wheels=../shared/wheels; fi
  fi
  if compgen -G "$wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps "$wheels"/*.whl || exit 2
  fi
  # editable, so the checkout's own files run; needs setuptools >= 64 and either setuptools
  # >= 70.1 or the wheel package (the GPU images have both), nothing downloaded
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>"$LOGS/setup.log" || {
    tail -n 5 "$LOGS/setup.log" >&2
    echo "bench/gpu.sh: could not install this checkout (setuptools >= 64 with wheel needed)" >&2
    exit 2
  }
  "$PY" -c "
import importlib.metadata as m, hydra, omegaconf, tuneup.trainer
assert m.entry_points(group='tuneup'), 'no tuneup entry points: the project is not installed'
" || { echo "bench/gpu.sh: setup failed (see above and $LOGS/setup.log)" >&2; exit 2; }
}

status_of() {  # ok, failed ..., or nothing when the step has not run
  [[ -f $(file_of "$1") ]] && sed -n 's/^<!-- status: \(.*\) -->$/\1/p;q' "$(file_of "$1")"
}

run_step() {
  local step=$1 command started seconds code out
  command=$(command_of "$step")
  out="$LOGS/$step.out"
  echo "== $step: $command" >&2
  started=$(date +%s)
  timeout "$(timeout_of "$step")" bash -c "$command" >"$out" 2>"$LOGS/$step.err"
  code=$?
  seconds=$(($(date +%s) - started))
  {
    if [[ $code == 0 ]]; then echo "<!-- status: ok -->"; else echo "<!-- status: failed (exit $code) -->"; fi
    echo
    echo "### $step ($seconds s, exit $code)"
    echo
    echo "\`$command\`"
    echo
    if [[ $step == gpu-tests || $step == suite ]]; then  # pytest: its summary
      echo '```'
      tail -n 40 "$out"
      echo '```'
    elif grep -q '^|' "$out"; then  # a Markdown table and its notes
      cat "$out"
    else  # aligned columns (bench/kernels.py): kept as they are
      echo '```'
      cat "$out"
      echo '```'
    fi
    if [[ $code != 0 ]]; then
      echo
      echo "Last lines of its error output:"
      echo
      echo '```'
      tail -n 40 "$LOGS/$step.err"
      echo '```'
    fi
  } >"$(file_of "$step")"
  echo "== $step: exit $code after $seconds s" >&2
  return "$code"
}

report() {  # gpu-report.md: the machine, a status line per step, then each step's section
  local step file
  {
    echo "# bench/gpu.sh report"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    if command -v nvidia-smi >/dev/null; then
      echo "; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    fi
    "$PY" -c "
import importlib.metadata as m
print('; ' + ', '.join(f'{p} {m.version(p)}' for p in ('torch', 'triton', 'pytorch-lightning')))
" 2>/dev/null
    echo
    echo "| step | status |"
    echo "|---|---|"
    for step in "${STEPS[@]}"; do echo "| $step | $(status_of "$step" || true) |"; done
    for step in "${STEPS[@]}"; do
      file=$(file_of "$step")
      [[ -f $file ]] && { echo; tail -n +2 "$file"; }
    done
  } >"$RESULTS/gpu-report.md"
}

main() {
  local requested=() step failed=0
  for arg in "${@:-all}"; do
    case $arg in
      all) requested+=("${STEPS[@]}") ;;
      1) requested+=("${PART_1[@]}") ;;
      2) requested+=("${PART_2[@]}") ;;
      3) requested+=("${PART_3[@]}") ;;
      quick) QUICK=1; requested+=("${PART_QUICK[@]}") ;;
      report) ;;
      --list)
        for step in "${STEPS[@]}"; do echo "$step: $(command_of "$step")"; done
        return 0 ;;
      *)
        if [[ -z $(number_of "$arg") ]]; then
          echo "bench/gpu.sh: unknown step '$arg'; steps: ${STEPS[*]}, parts: 1 2 3 quick, all, report" >&2
          return 2
        fi
        requested+=("$arg") ;;
    esac
  done
  mkdir -p "$RESULTS" "$LOGS"
  local pending=()
  for step in "${requested[@]}"; do
    if [[ ${GPU_FORCE:-0} != 1 && $(status_of "$step") == ok ]]; then
      echo "== $step: ok in $RESULTS already (GPU_FORCE=1 runs it again)" >&2
    else
      pending+=("$step")
    fi
  done
  [[ ${#pending[@]} -gt 0 ]] && setup
  for step in "${pending[@]}"; do
    run_step "$step" || failed=1
    report
  done
  report
  if [[ -n ${OUT:-} && $(realpath "$RESULTS") != $(realpath "$OUT") ]]; then
    cp "$RESULTS"/*.md "$OUT"/
  fi
  echo "== report: $RESULTS/gpu-report.md" >&2
  for step in "${requested[@]}"; do [[ $(status_of "$step") == ok ]] || failed=1; done
  return "$failed"
}

main "$@"
