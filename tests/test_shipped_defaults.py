"""The values the shipped YAML configs write equal the defaults of the dataclasses they feed, except where a config
sets one on purpose: a changed default then fails here instead of leaving a YAML that shows users another value."""

import dataclasses
import glob
import os

from omegaconf import OmegaConf

from tba_ext.core.settings import IS_RATIO_MAX, SAMPLER_KWARGS, ReplaySettings, checked_type, parse_replay_settings
from tba_ext.tools.config import CONFIG_DIR, compose

POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
REPLAY_FIELDS = {f.name: f for f in dataclasses.fields(ReplaySettings)}

# sampler_kwargs a config sets on purpose to another value than ReplaySettings' (the reason is the YAML's comment);
# every other key a YAML writes must be the dataclass default
INTENDED = {
    "cpu_tba.yaml": {"recency_prob"},  # m = 0.5: replays more on tiny runs
    # the decoupled mode: recency window 2k, free-running searchers, and on CPU a staleness cap of 4 versions
    "cpu_tba_decoupled.yaml": {"recency_window", "max_staleness", "min_fresh_groups"},
    "gpu/_decoupled.yaml": {"recency_window", "min_fresh_groups"},
    "gpu/tba_gpt2_redteam.yaml": {"recency_prob", "reward_inv_temp", "recency_window"},  # the paper's red-teaming
    "gpu/tba_pythia-1b_tldr.yaml": {  # the reference TL;DR run
        "recency_prob",
        "reward_inv_temp",
        "samples_per_prompt",
        "recency_window",
        "min_buffer_groups",
    },
    "gpu/tba_qwen2.5-7b_gsm8k_fsdp2.yaml": {"samples_per_prompt"},  # S = floor(1.2 K)
    "gpu/tba_rhomath-1b_gsm8k.yaml": {"samples_per_prompt", "min_buffer_groups"},  # the reference's buffer
}


def shipped_sampler_kwargs() -> dict[str, dict]:
    """Each shipped YAML's own ``sampler_kwargs`` node, as written (before composition), by path under configs/."""
    found = {}
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "**", "*.yaml"), recursive=True)):
        node = OmegaConf.select(OmegaConf.load(path), SAMPLER_KWARGS.rstrip("."))
        if node is not None:
            found[os.path.relpath(path, CONFIG_DIR)] = OmegaConf.to_container(node)
    return found


def test_is_ratio_max_in_tb_pg_yaml_is_the_dataclass_default_and_the_constant():
    from tba_ext.adapters.policy_loss_config import TBPolicyLossConfig

    default = {f.name: f.default for f in dataclasses.fields(TBPolicyLossConfig)}["is_ratio_max"]
    assert default == IS_RATIO_MAX
    written = OmegaConf.select(OmegaConf.load(os.path.join(CONFIG_DIR, "algo", "tb_pg.yaml")), POLICY_LOSS)
    assert written.is_ratio_max == IS_RATIO_MAX, f"algo/tb_pg.yaml: is_ratio_max = {written.is_ratio_max!r}"
    # and what verl gets: the CPU config that selects algo/tb_pg leaves it as the algo YAML writes it
    composed = compose("cpu_tb_pg", ["run_dir=/nonexistent"])
    assert OmegaConf.select(composed, f"{POLICY_LOSS}.is_ratio_max") == IS_RATIO_MAX


def test_every_sampler_kwarg_a_yaml_writes_is_a_field_and_the_default_unless_set_on_purpose():
    shipped = shipped_sampler_kwargs()
    # the configs that select the replay sampler are all found (a moved key would otherwise pass unchecked)
    assert {"cpu_tba.yaml", "cpu_tba_decoupled.yaml", "gpu/_decoupled.yaml"} <= set(shipped), sorted(shipped)
    for name, node in shipped.items():
        for key, value in node.items():
            where = f"{name}: {SAMPLER_KWARGS}{key}"
            assert key in REPLAY_FIELDS, f"{where} is not a ReplaySettings field; known: {sorted(REPLAY_FIELDS)}"
            checked_type(value, REPLAY_FIELDS[key].type, where)
            if key not in INTENDED.get(name, set()):
                default = REPLAY_FIELDS[key].default
                assert value == default, f"{where} = {value!r}, ReplaySettings says {default!r}"
        parse_replay_settings(node, SAMPLER_KWARGS)  # and within range


def test_each_intended_override_is_still_written_in_its_yaml():
    """A stale entry in INTENDED would exempt that key from the default check the next time a YAML writes it."""
    shipped = shipped_sampler_kwargs()
    for name, keys in INTENDED.items():
        written = set(shipped.get(name, {}))
        assert keys <= written, f"{name} no longer sets {sorted(keys - written)}: remove them from INTENDED"
