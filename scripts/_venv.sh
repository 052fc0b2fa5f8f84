# Sourced by scripts/demo, scripts/test and scripts/bench: creates or refreshes .venv with the
# pinned dependencies. Re-installs only when pyproject.toml or constraints.txt changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TSUP_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
stamp_want="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.tsup-stamp" 2>/dev/null)" != "$stamp_want" ]; then
    echo "setting up $VENV (pinned dependencies, torch CPU build)..." >&2
    "$PY" -m venv "$VENV"
    # torch is pinned to 2.13.0 through constraints.txt: a bare `torch` would pull a CUDA build.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$ROOT/constraints.txt" \
        -e "$ROOT[train,report,diagnostics,trainers,dev]" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
    "$VENV/bin/python" -c "import supervisor, torch, psutil, structlog, watchdog, pynvml, transformers, accelerate, pytorch_lightning, lightning, rich, tensorboard, mlflow, sqlalchemy, loguru" \
        || { echo "venv setup failed" >&2; exit 1; }
    echo "$stamp_want" > "$VENV/.tsup-stamp"
fi
export PATH="$VENV/bin:$PATH"
# The package is installed editable, and environments that set PYTHONDONTWRITEBYTECODE (CI does)
# then compile every module again at each daemon start: ~80 ms before each run's first launch
# that an installed wheel (pip writes its .pyc) does not pay. Up-to-date files are skipped.
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/supervisor" >/dev/null || true
