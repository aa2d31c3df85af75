#!/usr/bin/env bash
# TBA for Qwen2.5-7B on GSM8K: 4 trainer GPUs (FSDP2) + 4 vLLM searcher GPUs on one 8-GPU node.
# Needs: pip install "verl[vllm,fsdp]==0.9.1" ./tba-ext (fsdp: flash-attn); data (every row: 7473 train / 1319 test) from
#   tba-ext prepare-data --task gsm8k --source /path/to/gsm8k --out $DATA_DIR
set -euo pipefail
export MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B}
export DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
export CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints}
CONFIG=${CONFIG:-tba_qwen2.5-7b_gsm8k_fsdp2}   # or drgrpo_qwen2.5-7b_gsm8k_fsdp2 for the baseline twin
tba-ext doctor
python -m verl.trainer.main_ppo \
  --config-path "$(tba-ext configs --path "$CONFIG")" --config-name "$CONFIG" "$@"
