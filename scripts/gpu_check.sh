#!/usr/bin/env bash
# Run the CUDA tests and the GPU benchmarks on a machine with a GPU.
#   scripts/gpu_check.sh [MODEL] [CORPUS]
# MODEL defaults to smollm2-135m; CORPUS to wiki-sample. Writes nothing outside /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODEL=${1:-smollm2-135m}
CORPUS=${2:-wiki-sample}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
$PY -m pytest -q -p no:cacheprovider tests/gpu
$PY benchmarks/capture.py --model "$MODEL" --corpus "$CORPUS" --device cuda --batch-size 32 --seq-len 256 --repeats 5
$PY benchmarks/capture.py --model "$MODEL" --corpus "$CORPUS" --device cpu --repeats 3
$PY benchmarks/logit_lens.py --model "$MODEL" --corpus "$CORPUS" --tokens 4096 || true
for n in 50000 200000; do $PY benchmarks/store_read.py --model "$MODEL" --corpus "$CORPUS" --device cuda --tokens $n; done
