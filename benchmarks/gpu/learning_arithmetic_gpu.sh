#!/usr/bin/env bash
# SAO vs GRPO with DIS vs GRPO on generated arithmetic, on one GPU (an H200): held-out accuracy
# at equal samples, bf16, batch 64, 300 steps. Nothing imports or runs this script; nothing else in
# the project needs a GPU.
#
#   bash benchmarks/gpu/learning_arithmetic_gpu.sh            # figures in $OUT (if set) and $RUNS
#   STEPS=150 SEEDS=1,2 bash benchmarks/gpu/learning_arithmetic_gpu.sh --lora
#
# NOT RUN YET. It was written on a machine without a GPU by reading the code paths below; the
# first run on a GPU is its test. The sizing is an estimate, not a measurement.
#
# What it does: benchmarks/learning_arithmetic.py (the CPU benchmark: same runs, same analysis,
# same outputs) with GPU settings passed as Hydra overrides (--set), so the algorithms, the
# budget arithmetic and the statistics are one copy:
#   device=cuda                     the learner on the GPU (rl/training/build.py _device)
#   optim.bf16=true                 bf16 autocast; attention is then sdpa (model.attn_implementation
#                                   auto picks eager only on the CPU); master weights stay fp32
#   model.engine_dtype=bfloat16     what vLLM serves and the weight sync writes (the benchmark starts
#                                   its engines with this dtype)
#   batch_size=64                   64 single rollouts (SAO) or 16 prompts x 4 (GRPO) per step
#   optim.token_budget=32768        micro-batches of 32k padded tokens instead of the CPU's 1024
#   rollout.concurrency=64          the whole batch in flight at once
#   checkpoint_every=1000           a checkpoint at the end only (each one writes ~1.6 GB: policy,
#                                   critic and their AdamW states, fp32)
#   engine.extra_args=[--enforce-eager]  no CUDA-graph capture or torch.compile at start-up: a
#                                   135M model's decode is launch-bound either way, and three
#                                   engines start one after another
# engine.kv_cache_gib is CPU-only (VLLM_CPU_KVCACHE_SPACE); on CUDA each engine's memory is
# --gpu-memory-utilization (0.15 x 139 GiB = 21 GiB each; the model is 0.3 GB, the KV cache of
# 64 sequences x 2048 tokens about 3 GB), passed by sao.agents.engine only when a GPU is present.
#
# Concurrency: one engine per run (--engines = runs), all runs at once on the one GPU: an engine
# serves one run's weights at a time (each step reloads them), so runs cannot share one. Memory:
# 3 engines x 21 GiB + 3 learners x ~3 GB (135M fp32 + AdamW + critic + activations) = ~75 GiB.
#
# Sizing (estimate): per step ~1 s of generation (64 x <=256 tokens, eager), ~0.3 s of updates,
# ~1 s of weight sync (save 270 MB bf16 + reload + probe): ~2-3 s, so 300 steps ~10-15 min per run
# even in parallel, which is more than the 10 minutes allowed. Rather than guess a lower step count,
# --deadline-s stops training at DEADLINE_S seconds after the engines begin to start (520 s; the
# engines' start, ~2 min for three, counts) and the report uses each run's evaluations so far
# (runs marked unfinished with *). Evaluations every 50 steps (--eval-points 7) of 200 problems,
# greedy, ~3 s each, so a stopped run still has a curve. After the first run, set STEPS from the
# printed step times (summary.json: runs[].evals[].train_s) so that every run finishes.
#
# Outputs: $RUNS/ (default runs/learning_arithmetic_gpu): heldout.png, curves.png, summary.json and
# one folder per run; when $OUT is set, the figures, summary.json and each run's small logs
# (metrics, evaluations, config) are copied there.
set -euo pipefail
cd "$(dirname "$0")/../.."

STEPS=${STEPS:-300}
BATCH=${BATCH:-64}
SEEDS=${SEEDS:-1}
ALGOS=${ALGOS:-sao,grpo_dis,grpo}
DEADLINE_S=${DEADLINE_S:-520}
GPU_UTIL=${GPU_UTIL:-0.15}
RUNS=${RUNS:-runs/learning_arithmetic_gpu}

if ! .venv/bin/python -c "import sys, torch, vllm; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "no CUDA torch + vllm in .venv: running SAO_EXTRAS=gpu,dev bash scripts/setup" >&2
  SAO_EXTRAS=gpu,dev bash scripts/setup
fi

n_algos=$(tr ',' '\n' <<<"$ALGOS" | grep -c .)
n_seeds=$(tr ',' '\n' <<<"$SEEDS" | grep -c .)
engines=$((n_algos * n_seeds))
if [[ " $* " == *" --lora "* ]]; then engines=$((engines + 1)); fi

rc=0
.venv/bin/python benchmarks/learning_arithmetic.py \
  --algos "$ALGOS" --seeds "$SEEDS" --lora-seeds "${SEEDS%%,*}" \
  --budget $((STEPS * BATCH)) --eval-points 7 \
  --engines "$engines" --gpu-memory-utilization "$GPU_UTIL" --deadline-s "$DEADLINE_S" \
  --set device=cuda --set optim.bf16=true --set model.engine_dtype=bfloat16 \
  --set batch_size="$BATCH" --set optim.token_budget=32768 --set rollout.concurrency=64 \
  --set checkpoint_every=1000 --set 'engine.extra_args=["--enforce-eager"]' \
  --out "$RUNS" "$@" || rc=$?   # 1: some run stopped at the deadline or failed; the report is still written

if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  for f in heldout.png curves.png summary.json vllm-0.log; do
    [[ -f "$RUNS/$f" ]] && cp "$RUNS/$f" "$OUT/"
  done
  for d in "$RUNS"/*-seed*/; do
    name=$(basename "$d")
    mkdir -p "$OUT/$name"
    for f in metrics.jsonl eval.jsonl value_pretrain.jsonl config.json bench.json; do
      [[ -f "$d/$f" ]] && cp "$d/$f" "$OUT/$name/"
    done
  done
  echo "copied the figures and logs to $OUT"
fi
exit "$rc"
