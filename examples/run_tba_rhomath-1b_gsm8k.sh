#!/usr/bin/env bash
# The paper's GSM8K setting (Table 2): RhoMath-1B SFT, 1 trainer GPU + 3 vLLM searcher GPUs.
# Needs: pip install "verl[vllm,fsdp]==0.9.1" ./tba-ext (fsdp: flash-attn); data (every row: 7473 train / 1319 test) from
#   tba-ext prepare-data --task gsm8k --source /path/to/gsm8k --out $DATA_DIR
set -euo pipefail
export MODEL_PATH=${MODEL_PATH:-realtreetune/rho-1b-sft-GSM8K}
export DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
tba-ext doctor
python -m verl.trainer.main_ppo \
  --config-path "$(tba-ext configs --path tba_rhomath-1b_gsm8k)" --config-name tba_rhomath-1b_gsm8k "$@"
