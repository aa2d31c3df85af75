"""Names that travel between tba-ext's processes, in one place: the fields and extra_info keys the trainer puts on
the batches it hands verl's workers, the field a searcher attaches to its output, and the metric the workers
report back. Plain strings, no verl import: the trainer (adapters), the searchers (cpu) and the workers all read
them from here."""

# a searcher's output ``extra_fields`` entry: the reference's log-probs of the response, computed by the searcher
# with its copy of the initial model (``tba_ext.cpu.hf_rollout``); kept with the trajectory in the replay store
SEARCHER_REFERENCE = "tba_ref_log_probs"

# extra_info keys the trainer sets on the batch it hands update_actor (the fused loss reads them)
BETA_KEY = "tba_beta"
MODE_KEY = "tba_loss_mode"
GROUP_SIZE_KEY = "tba_group_size"
GROUP_FIELD = "tba_group"  # per row: its prompt group's index

# what the trainer hands the update's call when the reference pass runs inside it (tba.ref_in_update):
TODO_FIELD = "tba_ref_todo"  # per row: 1 = compute its reference log-probs before the update
KEY_FIELD = "tba_key"  # per row: its TransferQueue key, under which the worker stores the values it computed
PARTITION_KEY = "tba_ref_partition"  # extra_info: the batch's TransferQueue partition
MICRO_BATCH_KEY = "tba_ref_micro_batch_size_per_gpu"  # extra_info: the reference pass's static micro-batch

# seconds of an update_actor call spent on the reference forward inside it (verl logs it as actor/<name>)
REFERENCE_IN_UPDATE_METRIC = "tba/reference_in_update_s"

# the fused loss's run-time guard, reported with the update's metrics and read back by the trainer
BAD_GROUPS_METRIC = "tba/groups_not_whole"
