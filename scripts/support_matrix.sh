#!/usr/bin/env bash
# The support matrix, tested (issue 44): one venv per corner of the Python and torch versions
# the package declares, each running the unit tests (tests/unit) and the examples that need no
# extra framework, on CPU. Prints one line per corner with the counts.
#
#   scripts/support_matrix.sh                  # every corner, one after the other
#   scripts/support_matrix.sh bare oldest      # some of them
#
# Corners (name: Python, torch):
#   bare:    python3.11, torch 2.13.0; a wheel of this tree installed with its declared
#            dependencies only (no test extra): the examples only, as a user's install runs them
#   oldest:  Python 3.9, torch 2.4.1 (the lower bounds in pyproject.toml)
#   middle:  Python 3.10, torch 2.6.0 (fully_shard public in torch.distributed.fsdp)
#   newest:  Python 3.13, the newest torch on the registry (upgraded at each run)
#
# The venvs are cached between runs under $RESUME_EQUIV_MATRIX_DIR (default
# ~/.cache/resume-equiv-matrix): a corner's first run downloads its torch (the registry's
# default build, with its CUDA libraries as separate packages: several GB per venv), later
# runs only reinstall the wheel of this tree. Pythons are found as pythonX.Y on PATH or under
# pyenv ($PYENV_ROOT/versions/X.Y.*); a corner whose Python is missing says so and is skipped.
#
# pip configuration: this script ignores pip's configuration files (PIP_CONFIG_FILE=/dev/null)
# and clears PIP_CONSTRAINT, so a machine-wide constraint file (one that caps torch at the
# versions on a machine's disk) cannot hold a corner back. pip settings given in the
# environment (PIP_FIND_LINKS, PIP_CERT, ...) still apply: a local wheel that fits is used.
#
# Results: the corner lines are printed, and appended with the date to
# $RESUME_EQUIV_MATRIX_DIR/results.txt; each corner's full output is in its log there.
# Exit status: 0 when every corner that ran passed, 1 otherwise. The runs are niced and the
# unit tests use $MATRIX_JOBS xdist workers (default 1): the machine may be shared.
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${RESUME_EQUIV_MATRIX_DIR:-$HOME/.cache/resume-equiv-matrix}"
JOBS="${MATRIX_JOBS:-1}"
EXAMPLES=(minimal golden data_loading/test_other_world_size.py crash equivalent)
mkdir -p "$DIR"

export PIP_CONFIG_FILE=/dev/null
unset PIP_CONSTRAINT PIP_REQUIRE_VIRTUALENV
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH

corner_spec() { # name -> "python torch-requirement"
  case "$1" in
    bare) echo "3.11 torch==2.13.0" ;;
    oldest) echo "3.9 torch==2.4.1" ;;
    middle) echo "3.10 torch==2.6.0" ;;
    newest) echo "3.13 torch" ;;
    *) return 1 ;;
  esac
}

find_python() { # X.Y -> an interpreter of that version, or nothing
  local want="$1" candidate
  for candidate in "$(command -v "python$want" 2>/dev/null)" \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python"$want"; do
    if [ -x "$candidate" ] && "$candidate" -c 'import venv' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

summary() { # a pytest log -> its closing counts ("801 passed, 1 skipped"), or what stopped it
  local line
  line="$(grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$1" | tail -1 \
    | sed -E 's/^=+ //; s/ in [0-9.]+s.*//; s/, [0-9]+ warnings?//')"
  echo "${line:-no summary (see the log)}"
}

build_wheel() {
  local work="$DIR/wheel"
  rm -rf "$work" && mkdir -p "$work/source"
  # a copy, so that the build leaves no build/ or egg-info in the tree
  cp -r "$REPO/pytest_resume_equiv" "$REPO/pyproject.toml" "$REPO/README.md" "$work/source/"
  find "$work/source" -name __pycache__ -prune -exec rm -rf {} +
  python3 -m pip wheel -q --no-deps -w "$work/dist" "$work/source" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; return 1; }
  WHEEL="$(ls "$work"/dist/pytest_resume_equiv-*.whl)"
}

prepare_venv() { # name python torch-requirement log X.Y -> VENV (created or reused), or return 1
  local name="$1" python="$2" torch_req="$3" log="$4" # $5: the Python's X.Y
  VENV="$DIR/$name-py$5"
  if [ ! -x "$VENV/bin/python" ]; then
    "$python" -m venv "$VENV" >>"$log" 2>&1 || return 1
    nice "$VENV/bin/python" -m pip install -q --upgrade pip >>"$log" 2>&1 || return 1
  fi
  local upgrade=()
  [ "$torch_req" = torch ] && upgrade=(--upgrade --upgrade-strategy only-if-needed)
  nice "$VENV/bin/python" -m pip install -q "${upgrade[@]}" "$torch_req" >>"$log" 2>&1 || return 1
  local version
  version="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>>"$log")" || return 1
  # torch pinned to what is installed, so that no other requirement moves it
  if [ "$name" = bare ]; then
    # the declared dependencies only: nothing that the test extra would bring
    nice "$VENV/bin/python" -m pip uninstall -q -y pytest-resume-equiv >>"$log" 2>&1
    nice "$VENV/bin/python" -m pip install -q "$WHEEL" "torch==${version%%+*}" >>"$log" 2>&1 \
      || return 1
  else
    nice "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$WHEEL" >>"$log" 2>&1 \
      && nice "$VENV/bin/python" -m pip install -q "$WHEEL[test]" "torch==${version%%+*}" \
        >>"$log" 2>&1 || return 1
  fi
}

run_corner() {
  local name="$1" spec pyver torch_req python log start
  spec="$(corner_spec "$name")" || {
    echo "unknown corner '$name' (bare, oldest, middle, newest)" >&2
    return 2
  }
  read -r pyver torch_req <<<"$spec"
  log="$DIR/$name.log"
  : >"$log"
  python="$(find_python "$pyver")"
  if [ -z "$python" ]; then
    LINE="$(printf '%-7s python %-8s skipped: no python%s on PATH or under pyenv' \
      "$name" "$pyver" "$pyver")"
    return 0
  fi
  start=$SECONDS
  if ! prepare_venv "$name" "$python" "$torch_req" "$log" "$pyver"; then
    LINE="$(printf '%-7s python %-8s %s: the venv could not be built (see %s)' \
      "$name" "$pyver" "$torch_req" "$log")"
    return 1
  fi
  local py="$VENV/bin/python" versions unit="not run" examples rc=0
  versions="$("$py" -c 'import platform, torch; print(platform.python_version(), torch.__version__)' 2>/dev/null)"
  read -r pyver torch_ver <<<"$versions"
  if [ "$name" = bare ]; then
    # the point of this corner: what the test extra brings (numpy first) is not there
    if "$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("numpy") is not None)'; then
      unit="none (a user's install: no test extra, no numpy)"
    else
      unit="none, but numpy is installed: not a bare install"
      rc=1
    fi
  else
    local xdist=()
    [ "$JOBS" -gt 1 ] && xdist=(-n "$JOBS")
    (cd "$REPO" && nice "$py" -m pytest tests/unit -q -rs -p no:cacheprovider "${xdist[@]}" \
      >"$DIR/$name.unit.log" 2>&1) || rc=1
    unit="$(summary "$DIR/$name.unit.log")"
  fi
  # the examples from a copy, with the installed wheel (not this tree) on the path
  local work="$DIR/$name.examples"
  rm -rf "$work" && cp -r "$REPO/examples" "$work"
  (cd "$work" && nice "$py" -m pytest -p resume_equiv --resume-equiv-device=cpu -q \
    -p no:cacheprovider "${EXAMPLES[@]}" >"$DIR/$name.examples.log" 2>&1) || rc=1
  examples="$(summary "$DIR/$name.examples.log")"
  LINE="$(printf '%-7s python %-8s torch %-14s unit: %s; examples: %s (%dm%02ds)' \
    "$name" "$pyver" "$torch_ver" "$unit" "$examples" \
    $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)))"
  [ "$rc" -eq 0 ] || LINE="$LINE  FAILED (logs: $DIR/$name.*.log)"
  return "$rc"
}

main() {
  local corners=("$@") status=0 lines=() name
  [ ${#corners[@]} -gt 0 ] || corners=(bare oldest middle newest)
  build_wheel || exit 1
  for name in "${corners[@]}"; do # one after the other: never in parallel
    run_corner "$name" || status=1
    echo "$LINE"
    lines+=("$LINE")
  done
  {
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)"
    printf '%s\n' "${lines[@]}"
  } >>"$DIR/results.txt"
  exit "$status"
}

main "$@"
