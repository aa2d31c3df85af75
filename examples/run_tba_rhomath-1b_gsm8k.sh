#!/usr/bin/env bash
# The paper's GSM8K setting (Table 2): RhoMath-1B SFT, 1 trainer GPU + 3 vLLM searcher GPUs.
set -euo pipefail
export MODEL_PATH=${MODEL_PATH:-realtreetune/rho-1b-sft-GSM8K}
export DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
tba-ext doctor
python -m verl.trainer.main_ppo \
  --config-path "$(tba-ext configs --path tba_rhomath-1b_gsm8k)" --config-name tba_rhomath-1b_gsm8k "$@"
