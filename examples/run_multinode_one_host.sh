#!/usr/bin/env bash
# Decoupled TBA on a two-node Ray cluster, both nodes on this one host (a rehearsal of a real cluster on CPU):
# node 1 holds one logical GPU slot, node 2 another; verl puts the trainer's pool on one and the searcher's on
# the other, and weights cross nodes through Ray's object store. On real machines run the same two `ray start`
# lines on two hosts without the port flags (the defaults are free there), with --node-ip-address set to each
# host's address and --num-gpus to its GPU count, and the `tba-ext train` line on the head node.
set -euo pipefail
RUN=${RUN:-tba_multinode_run}
GCS_PORT=${GCS_PORT:-6390}
HEAD_IP=$(python -c "import ray; print(ray.util.get_node_ip_address())")
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
tba-ext make-model --out "$RUN/model" --size tiny
tba-ext prepare-data --task arith --out "$RUN/data"

# Node 1 (head) and node 2; --block keeps each node's processes under one PID we can stop.
ray start --block --head --port="$GCS_PORT" --num-cpus=8 --num-gpus=1 \
  --object-store-memory=200000000 --include-dashboard=false --temp-dir="/tmp/tba_cluster_$$" \
  --ray-client-server-port=10101 --node-manager-port=10102 --object-manager-port=10103 \
  --min-worker-port=10200 --max-worker-port=10299 --dashboard-agent-listen-port=10104 \
  --dashboard-agent-grpc-port=10105 --metrics-export-port=10106 --runtime-env-agent-port=10107 &
HEAD=$!
sleep 5
ray start --block --address="$HEAD_IP:$GCS_PORT" --temp-dir="/tmp/tba_cluster_$$" --num-cpus=8 --num-gpus=1 \
  --object-store-memory=200000000 --node-manager-port=10112 --object-manager-port=10113 \
  --min-worker-port=10300 --max-worker-port=10399 --dashboard-agent-listen-port=10114 \
  --dashboard-agent-grpc-port=10115 --metrics-export-port=10116 --runtime-env-agent-port=10117 &
WORKER=$!
trap 'kill -TERM $WORKER $HEAD 2>/dev/null; wait' EXIT  # stops exactly these two nodes (not `ray stop`)
until ray status --address="$HEAD_IP:$GCS_PORT" 2>/dev/null | grep -q "2.0 GPU"; do sleep 2; done

# Joining a cluster: the run drops its own num_cpus/num_gpus (the nodes declared their resources).
tba-ext train --config cpu_tba_decoupled --run-dir "$RUN" --metrics "$RUN/metrics.jsonl" \
  +ray_kwargs.ray_init.address="$HEAD_IP:$GCS_PORT" trainer.total_training_steps=10 "$@"
