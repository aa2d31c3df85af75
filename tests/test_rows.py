"""verl rows <-> the replay store's compact form: exact round trips, through TransferQueue's TensorDict form."""

import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from tba_ext.adapters.rows import build_row, load_prompt, split_row
from tba_ext.adapters.sampler import row_dicts


def agent_loop_row(prompt_ids, response_ids, response_mask, reward, session_id, position_ids=None):
    """A row as verl 0.9.1's V1 agent loop writes it (agent_loop_tq._agent_loop_postprocess)."""
    output = AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=response_mask,
        response_logprobs=[-0.1 * (i + 1) for i in range(len(response_ids))],
        reward_score=reward,
        num_turns=2 if 0 in response_mask else 1,
        metrics=AgentLoopMetrics(generate_sequences=0.5),
        extra_fields={"reward_extra_info": {"acc": reward}, "min_global_steps": 3, "max_global_steps": 4},
    )
    row = output.as_dict()
    row.update(
        {
            "uid": "u0",
            "session_id": session_id,
            "raw_prompt": [{"role": "user", "content": "1+1?"}],
            "data_source": "tba_ext/arith",
            "reward_model": {"ground_truth": "2"},
            "global_steps": 4,
            "extra_info": {"index": 7},
            "index": 7,
        }
    )
    input_ids = torch.cat([row["prompts"], row["responses"]])
    row.update(
        loss_mask=row["response_mask"],
        input_ids=input_ids,
        multi_modal_inputs={},
        position_ids=torch.arange(len(input_ids)) if position_ids is None else position_ids,
    )
    tag = {
        "status": "success",
        "prompt_len": len(prompt_ids),
        "response_len": len(response_ids),
        "seq_len": len(input_ids),
        "global_steps": 4,
        "min_global_steps": 3,
        "max_global_steps": 4,
    }
    return row, tag


def assert_same_rows(a: dict, b: dict):
    assert set(a) == set(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_rows_round_trip_exactly_including_non_standard_fields():
    plain = agent_loop_row([5, 6, 7], [8, 9, 10, 2], [1, 1, 1, 1], 1.0, session_id=0)
    # a tool-calling row: masked tool tokens, and position ids verl would compute differently (mrope-like)
    tool = agent_loop_row(
        [5, 6, 7], [8, 11, 12, 2], [1, 0, 0, 1], 0.25, session_id=1, position_ids=torch.tensor([0, 1, 2, 3, 3, 3, 4])
    )
    stored = [split_row(*plain), split_row(*tool)]
    assert stored[0][0] == stored[1][0]  # the prompt's fields are the same for its group: kept once
    assert len(stored[1][4]) > len(stored[0][4])  # the tool row keeps its own mask and positions
    rebuilt = []
    for (row, tag), (prompt, response, logprobs, reward, extras) in zip([plain, tool], stored):
        back, back_tag = build_row(load_prompt(prompt), response, logprobs, reward, extras, uid="u0")
        assert_same_rows(row, back)
        assert back_tag == tag
        rebuilt.append(back)
    # and they travel through TransferQueue's TensorDict form as verl's own rows do
    for a, b in zip(row_dicts(list_of_dict_to_tensordict(rebuilt)), [plain[0], tool[0]]):
        assert torch.equal(a["rollout_log_probs"], b["rollout_log_probs"]) and a["extra_fields"] == b["extra_fields"]
