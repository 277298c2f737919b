#!/usr/bin/env bash
# One-time check of issue #9 on a lent GPU machine (run from the repository
# root; fits in about 6 minutes). Everything it prints also goes to $OUT:
#   devices.txt    TensorFlow / torch versions and the GPUs they see
#   train.txt      VisionTransformer and TransformerTranslator: 5 XLA
#                  (jit_compile=True) training steps each, on the GPU
#   attention.txt  bench_attention.py table at lengths 512 and 2048
#   long.txt       bench_long_sequence.py at length 16,384 (GPU peak memory)
#
#   OUT=/tmp/gpu_out bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export TF_CPP_MIN_LOG_LEVEL=2
cd "$(dirname "$0")/.."

(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true) \
    > "$OUT/devices.txt" 2>&1
timeout 180 pip install -q -e . > "$OUT/pip.txt" 2>&1 || echo "pip install -e . failed (see pip.txt)" | tee -a "$OUT/devices.txt"
timeout 60 python - >> "$OUT/devices.txt" 2>&1 <<'EOF'
import tensorflow as tf, keras
print("tensorflow", tf.__version__, "keras", keras.__version__,
      "GPUs:", tf.config.list_physical_devices("GPU"))
try:
    import torch
    print("torch", torch.__version__, "cuda:", torch.cuda.is_available())
except ImportError:
    print("torch not installed")
EOF
cat "$OUT/devices.txt"

timeout 150 python - 2>&1 <<'EOF' | tee "$OUT/train.txt"
import os, sys, time
sys.path.insert(0, "benchmarks")
import tensorflow as tf
import bench_applications as apps
for name in ["VisionTransformer", "TransformerTranslator"]:
    try:
        step, batch = apps.build(name, "f32", True)
        t0 = time.perf_counter(); first = step(); t1 = time.perf_counter()
        losses = [step() for _ in range(5)]
        t2 = time.perf_counter()
        print(f"{name}: XLA train OK on {tf.config.list_logical_devices('GPU') or 'CPU'}; "
              f"first step {t1 - t0:.1f} s, then {5 / (t2 - t1):.1f} steps/s "
              f"(batch {batch}); losses {first:.4f} -> {losses[-1]:.4f}", flush=True)
    except Exception as e:
        print(f"{name}: FAILED {type(e).__name__}: {str(e)[:500]}", flush=True)
EOF

timeout 150 python benchmarks/bench_attention.py --lengths 512 2048 --repeats 5 \
    --matmul-size 4096 2>&1 | grep -v "^WARNING\|^I0000\|^E0000\|retracing" \
    | tee "$OUT/attention.txt"

timeout 120 python benchmarks/bench_long_sequence.py --lengths 16384 \
    --impls ours-xla ours-core torch-sdpa --repeats 2 --timeout 60 2>&1 \
    | tee "$OUT/long.txt"
echo "done; outputs in $OUT"
