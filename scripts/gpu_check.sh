#!/usr/bin/env bash
# The GPU checks of issues 12 and before, as one prepared script. Prints the figures; writes only under $OUT.
#
#   scripts/gpu_check.sh [--device cpu] [MODEL] [CORPUS]
#
# On a CUDA machine (default --device cuda):
#   1. tests/gpu: analyses on a GPU store equal the CPU results; the pipelined capture (side-stream copies into
#      pinned buffers) writes the serial capture's bytes; a device_map split captures the unsplit states; parts merge;
#   2. the capture benchmark: plain forward vs capture to a GPU store and to a disk store (fp16, serial and
#      pipelined), side by side with TransformerLens and nnsight; SmolLM2-shaped random model, batch 32 x 256
#      (targets: disk <= 1.15x, GPU store <= 1.02x the plain forward);
#   3. --part 1/2 + 2/2 on the GPU, merged and verified;
#   3b. the same capture by torchrun on every GPU of the machine (nproc = number of GPUs; on a one-GPU machine
#      two ranks share cuda:0, so the barrier and merge still run): merged by rank 0, verified, and compared
#      byte for byte with step 3's store (manifest apart from creation time, seal and merged_from);
#   3c. a bfloat16 model (--model-dtype bfloat16) captured on the device equals Hugging Face's bfloat16 hidden
#      states of the same window (to bfloat16 rounding), and the manifest says bfloat16;
#   4. the main job (every study) on the GPU, its wall time (--model-dtype auto: bfloat16 on CUDA);
#   5. the earlier GPU figures (logit lens, store read).
# --device cpu is a dry run of the same steps at toy sizes (tiny-llama), to check the script itself.
# MODEL defaults to smollm2-135m (the main job's model); CORPUS to wiki-sample. PYTHON picks the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
if [ "${1:-}" = "--device" ]; then DEVICE=${2:?--device needs a value}; shift 2; fi
PY=${PYTHON:-python3}
MODEL=${1:-smollm2-135m}
CORPUS=${2:-wiki-sample}
OUT=${OUT:-$(mktemp -d /tmp/lens-gpu-check.XXXXXX)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if [ "$DEVICE" = cpu ]; then   # dry run: every step, toy sizes
  BENCH=(--model tiny-llama --batch-size 2 --seq-len 32 --batches 2 --repeats 1)
  JOB_MODEL=tiny-llama; JOB_TOKENS=600; JOB_ONLY=(--only logit-lens,intrinsic-dim,linearity)
  PART_MODEL=tiny-llama; PART_TOKENS=600; PART_SHARD="256 --batch-size 2"
else
  BENCH=(--model smollm2-random --batch-size 32 --seq-len 256 --batches 4 --repeats 5 --model-dtype float32)
  JOB_MODEL=$MODEL; JOB_TOKENS=20000; JOB_ONLY=()
  PART_MODEL=$MODEL; PART_TOKENS=50000; PART_SHARD=16384
fi
declare -a FAILED=()
step() {  # step NAME COMMAND...: run, time, remember failures, go on
  local name=$1; shift
  echo; echo "=== $name"
  local t0=$SECONDS
  "$@"; local rc=$?
  echo "=== $name: exit $rc, $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || FAILED+=("$name (exit $rc)")
}

step "environment" $PY -c "import torch, sys; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
if [ "$DEVICE" != cpu ]; then
  step "tests/gpu" $PY -m pytest -q -p no:cacheprovider tests/gpu
else
  step "tests/gpu (collected; skipped without CUDA)" $PY -m pytest -q -p no:cacheprovider tests/gpu
fi
step "capture benchmark ($DEVICE)" $PY benchmarks/capture.py "${BENCH[@]}" --corpus "$CORPUS" --device "$DEVICE"
step "capture --part 1/2, 2/2, merge, verify ($DEVICE)" bash -c '
  set -e
  for i in 1 2; do
    '"$PY"' -m app capture '"$PART_MODEL"' --corpus '"$CORPUS"' --max-tokens '"$PART_TOKENS"' --device '"$DEVICE"' \
      --dtype float16 --shard-tokens '"$PART_SHARD"' --quiet --part $i/2 --out '"$OUT"'/part$i
  done
  '"$PY"' -m app store merge '"$OUT"'/part1 '"$OUT"'/part2 --out '"$OUT"'/merged --quiet
  '"$PY"' -m app store verify '"$OUT"'/merged | tail -1'
NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "$DEVICE" = cpu ]; then NPROC=2; TR_DEVICE=(--device cpu)       # gloo on the CPU
elif [ "$NGPU" -ge 2 ]; then NPROC=$NGPU; TR_DEVICE=()               # rank r on cuda:r
else NPROC=2; TR_DEVICE=(--device cuda:0); fi                        # one GPU: two ranks share it
step "torchrun --nproc-per-node $NPROC capture, merged by rank 0, == --part store ($DEVICE, $NGPU GPUs)" bash -c '
  set -e
  '"$PY"' -m torch.distributed.run --standalone --nproc-per-node '"$NPROC"' -m lens capture '"$PART_MODEL"' \
    --corpus '"$CORPUS"' --max-tokens '"$PART_TOKENS"' '"${TR_DEVICE[*]}"' --dtype float16 --shard-tokens '"$PART_SHARD"' \
    --quiet --out '"$OUT"'/torchrun
  '"$PY"' -m app store verify '"$OUT"'/torchrun | tail -1
  '"$PY"' - '"$OUT"'/torchrun '"$OUT"'/merged <<"PYEOF"
import json, sys
from pathlib import Path
a, b = (Path(p) for p in sys.argv[1:3])
fa = {str(p.relative_to(a)) for p in a.rglob("*") if p.is_file()}
fb = {str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()}
assert fa == fb, sorted(fa ^ fb)
diff = [f for f in sorted(fa) if f != "manifest.json" and (a / f).read_bytes() != (b / f).read_bytes()]
ma, mb = (json.loads((r / "manifest.json").read_text()) for r in (a, b))
for m in (ma, mb):
    for k in ("created", "manifest_sha256", "merged_from"):
        m.pop(k, None)
print(f"torchrun store vs --part store: {len(fa)} files, {len(diff)} differ, manifests equal: {ma == mb}")
sys.exit(1 if diff or ma != mb else 0)
PYEOF'
step "bfloat16 model: capture == HF bfloat16 hidden states ($DEVICE)" $PY - "$DEVICE" "$PART_MODEL" "$CORPUS" <<"PYEOF"
import sys

import numpy as np
import torch

import lens

dev, name, corpus = sys.argv[1:4]
m = lens.load_model(name, device=dev, dtype="bfloat16")
st = lens.capture(m, corpus=corpus, sites=["resid_post"], max_tokens=2048, seq_len=128, batch_size=8,
                  dtype="bfloat16", progress=False)
rows = np.flatnonzero(st.tokens["window"] == st.tokens["window"][0])
ids = torch.as_tensor(st.tokens["token_id"][rows].astype(np.int64))[None].to(m.device)
with torch.inference_mode():
    hs = m.hf_model(input_ids=ids, output_hidden_states=True).hidden_states
worst = 0.0
for l in range(m.n_layers - 1):  # the last hidden state is after the final norm in most decoders
    got, ref = st.get(layer=l, site="resid_post")[rows].float().cpu(), hs[l + 1][0].float().cpu()
    worst = max(worst, float((got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)))
md = st.manifest["settings"].get("model_dtype")
print(f"{name} bfloat16 on {dev}: max |capture - HF| / max |HF| = {worst:.2e} over {m.n_layers - 1} layers; "
      f"manifest model_dtype {md}")
sys.exit(0 if worst <= 2.0 ** -7 and md == "bfloat16" else 1)
PYEOF
# its wall time is the step's seconds (and the "s in all" line of lens study all)
step "main job ($DEVICE)" $PY -m app study all --model "$JOB_MODEL" --corpus "$CORPUS" --max-tokens "$JOB_TOKENS" \
  --device "$DEVICE" --quiet "${JOB_ONLY[@]}" --out "$OUT/results"
if [ "$DEVICE" != cpu ]; then
  step "logit lens benchmark" $PY benchmarks/logit_lens.py --model "$MODEL" --corpus "$CORPUS" --tokens 4096
  for n in 50000 200000; do
    step "store read $n tokens" $PY benchmarks/store_read.py --model "$MODEL" --corpus "$CORPUS" --device "$DEVICE" --tokens $n
  done
fi
echo
if [ ${#FAILED[@]} -eq 0 ]; then echo "gpu_check: every step passed ($DEVICE); files in $OUT"; exit 0; fi
echo "gpu_check: ${#FAILED[@]} step(s) failed: ${FAILED[*]}"; exit 1
