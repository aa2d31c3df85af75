#!/usr/bin/env bash
# Decoupled TBA on a CPU machine: 1 trainer + 1 searcher replica as separate Ray actors.
set -euo pipefail
RUN=${RUN:-tba_decoupled_run}
tba-ext make-model --out "$RUN/model" --size tiny
tba-ext prepare-data --task arith --out "$RUN/data"
tba-ext train --config cpu_tba_decoupled --run-dir "$RUN" --metrics "$RUN/metrics.jsonl" trainer.total_training_steps=10 "$@"
