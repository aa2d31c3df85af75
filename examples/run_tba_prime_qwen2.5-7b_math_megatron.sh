#!/usr/bin/env bash
# TBA' (tb_pg, beta 0.005) for Qwen2.5-7B on MATH with Megatron, on one or more 8-GPU nodes. The paper's
# reference reset every 50 updates needs FSDP2 engines: this Megatron config runs without it (tba.ref_reset_every=0). Multi-node: `ray start --head` on node 0, `ray start --address=<node0>:6379` on the
# others (tba-ext installed everywhere), then run this on node 0 with NNODES set.
# Needs: pip install "verl[vllm,megatron]==0.9.1" ./tba-ext (the megatron extra brings megatron-core); data from
#   tba-ext prepare-data --task math --source /path/to/MATH --test-source /path/to/MATH-500 --out $DATA_DIR
set -euo pipefail
export MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B}
export DATA_DIR=${DATA_DIR:-$HOME/data/math}
export CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints}
NNODES=${NNODES:-1}
CONFIG=${CONFIG:-tba_qwen2.5-7b_math_megatron}  # or drgrpo_qwen2.5-7b_math_megatron
tba-ext doctor
python -m verl.trainer.main_ppo \
  --config-path "$(tba-ext configs --path "$CONFIG")" --config-name "$CONFIG" \
  trainer.nnodes="$NNODES" "$@"
