"""The offline model factory and the hfcpu rollout server (without Ray: the server object itself)."""

import asyncio
import json

import pytest
import torch

from tba_ext.tools.models import ModelSpec, check_model_dir, make_model


def test_make_model_is_deterministic_and_qwen_chat_ready(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = ["user\n1+2=? Answer with the number only.\nassistant\n3\n"] * 50
    a = make_model(str(tmp_path / "a"), texts, ModelSpec(size="tiny", seed=3))
    b = make_model(str(tmp_path / "b"), texts, ModelSpec(size="tiny", seed=3))
    assert a == b and a["parameters"] > 0
    ma = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    mb = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    assert ma.config.model_type == "qwen2"
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert len(tok("\n", add_special_tokens=False)["input_ids"]) == 1  # verl's Qwen chat handling needs this
    text = tok.apply_chat_template([{"role": "user", "content": "1+2=?"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok(text)["input_ids"]) == text


def test_model_dir_checks_name_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="actor_rollout_ref.model.path"):
        check_model_dir(str(tmp_path / "missing"))
    texts = ["abc 123\n"] * 20
    make_model(str(tmp_path / "m"), texts, ModelSpec(size="tiny", vocab_size=400))
    make_model(
        str(tmp_path / "big_vocab"),
        texts * 50 + [" ".join(str(i) for i in range(3000))],
        ModelSpec(size="tiny", vocab_size=2000),
    )
    # a tokenizer that does not belong to the model
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tmp_path / "big_vocab").save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="do not belong together"):
        check_model_dir(str(tmp_path / "m"))


@pytest.fixture()
def server(tiny_run):
    from tba_ext.cpu.hf_rollout import HFCPUServer

    return HFCPUServer(str(tiny_run / "model"), prompt_length=32, response_length=8, seed=0)


def prompt_ids(tiny_run, question="3+4=? Answer with the number only."):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_run / "model")
    return tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_server_batches_concurrent_requests_and_logprobs_match_a_forward_pass(tiny_run, server):
    ids = list(prompt_ids(tiny_run))
    temperature = 0.7

    async def run():
        params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True}
        outs = await asyncio.gather(*[server.generate(ids, dict(params), f"r{i}") for i in range(12)])
        return outs, await server.stats()

    outs, stats = asyncio.run(run())
    assert stats["batches"] < 12 and stats["mean_batch_size"] > 1  # not one request at a time
    model = server.model
    for out in outs[:4]:
        seq = torch.tensor([ids + out.token_ids])
        with torch.no_grad():
            logits = model(seq).logits[0, len(ids) - 1 : -1] / temperature
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)
        assert out.stop_reason == "completed"


def test_ignore_eos_runs_every_response_to_its_length_and_keeps_its_logprobs(tiny_run):
    """verl's rollout.ignore_eos, as its vLLM server reads it: an EOS is sampled like any token and generation
    goes on to max_tokens; the log-probs stay those of the model's forward pass."""
    from tba_ext.cpu.hf_rollout import HFCPUServer

    ids = list(prompt_ids(tiny_run))
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    def run(server, n=16):
        return asyncio.run(asyncio.wait_for(_gather(server, ids, params, n), 120))

    stopping = run(HFCPUServer(str(tiny_run / "model"), prompt_length=32, response_length=8, seed=0))
    assert min(len(o.token_ids) for o in stopping) < 8  # the tiny model answers in fewer tokens: EOS stops it
    server = HFCPUServer(str(tiny_run / "model"), prompt_length=32, response_length=8, seed=0, ignore_eos=True)
    outs = run(server)
    assert all(len(o.token_ids) == 8 for o in outs)
    assert any(t in server.eos_token_ids for o in outs for t in o.token_ids[:-1])  # sampled EOS did not stop it
    for out in outs[:4]:
        with torch.no_grad():
            logits = server.model(torch.tensor([ids + out.token_ids])).logits[0, len(ids) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)


async def _gather(server, ids, params, n):
    return await asyncio.gather(*[server.generate(ids, dict(params), f"r{i}") for i in range(n)])


def test_min_batch_joins_requests_that_trickle_in_and_never_holds_a_short_batch_forever(tiny_run, monkeypatch):
    """Requests arriving in waves further apart than the join window: without ``min_batch`` each wave is its own
    generation batch; with it they run as one batch; fewer requests than ``min_batch`` still run after the wait."""
    from tba_ext.cpu.hf_rollout import HFCPUServer

    ids = list(prompt_ids(tiny_run))
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    gap = 3 * HFCPUServer.JOIN_QUIET_S

    async def waves(server, sizes):
        tasks = []
        for wave, size in enumerate(sizes):
            if wave:
                await asyncio.sleep(gap)
            tasks += [asyncio.ensure_future(server.generate(ids, dict(params), f"w{wave}r{i}")) for i in range(size)]
        outs = await asyncio.gather(*tasks)
        return outs, await server.stats()

    def serve(min_batch, sizes):
        server = HFCPUServer(str(tiny_run / "model"), 32, 8, seed=0, min_batch=min_batch)
        return asyncio.run(asyncio.wait_for(waves(server, sizes), 120))

    _, alone = serve(0, [4, 4, 4])
    assert alone["batches"] >= 2  # the waves do arrive apart
    outs, joined = serve(12, [4, 4, 4])
    assert joined["batches"] == 1 and joined["generated"] == 12 and len(outs) == 12
    monkeypatch.setattr(HFCPUServer, "MIN_BATCH_WAIT_S", 4 * gap)
    outs, short = serve(12, [4])  # the queue never reaches min_batch: the 4 requests run after the wait
    assert short["batches"] == 1 and len(outs) == 4 and all(o.token_ids for o in outs)
    with pytest.raises(ValueError, match="custom.min_batch_prompts"):
        HFCPUServer(str(tiny_run / "model"), 32, 8, seed=0, max_batch=8, min_batch=9)


@pytest.mark.parametrize("searchers, expected", [(1, 16 * 4), (2, 16 * 4 // 2)])
def test_a_decoupled_searcher_waits_for_its_share_of_one_dispatch(searchers, expected):
    """The decoupled config's ``min_batch_prompts`` is the data fetch (train_batch_size = 16 prompts, n = 4):
    each of N searchers waits for 1/N of its requests (verl's load balancer spreads them); sync runs do not wait."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from tba_ext.cpu.hf_rollout import HFCPUReplica
    from tba_ext.tools.config import compose

    def min_batch(name, *overrides):
        cfg = compose(name, ["run_dir=/nonexistent", *overrides])
        rollout = OmegaConf.to_container(cfg.actor_rollout_ref.rollout, resolve=True)
        return HFCPUReplica._min_batch(SimpleNamespace(config=SimpleNamespace(**rollout), world_size=1))

    decoupled = ["actor_rollout_ref.rollout.n=4", f"actor_rollout_ref.rollout.n_gpus_per_node={searchers}"]
    assert min_batch("cpu_tba_decoupled", *decoupled) == expected
    assert min_batch("cpu_tba", "actor_rollout_ref.rollout.n=4") == 0


def test_a_requests_sample_depends_on_its_seed_not_on_its_batch(tiny_run):
    """Per-request seeds: the k-th request for a prompt gets the same tokens whether it runs alone or among other
    prompts, the n requests of one prompt differ from each other, and the draws follow the model's distribution."""
    from tba_ext.cpu.hf_rollout import HFCPUServer

    ids, other = list(prompt_ids(tiny_run)), list(prompt_ids(tiny_run, "9+9=? Answer with the number only."))
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def samples(server, prompts):
        return [
            o.token_ids
            for o in await asyncio.gather(*[server.generate(p, dict(params), f"r{i}") for i, p in enumerate(prompts)])
        ]

    def fresh():
        return HFCPUServer(str(tiny_run / "model"), prompt_length=32, response_length=8, seed=5)

    alone = asyncio.run(samples(fresh(), [ids] * 6))
    mixed = asyncio.run(samples(fresh(), [other, ids, other, ids, ids, other, ids, ids, ids]))
    assert [m for p, m in zip([other, ids, other, ids, ids, other, ids, ids, ids], mixed) if p is ids] == alone
    assert len({tuple(a) for a in alone}) > 1  # occurrences are seeded apart
    # first-token frequencies over many seeded requests match the model's softmax (chi-square, 3 sd)
    server = fresh()
    draws = asyncio.run(samples(server, [ids] * 400))
    with torch.no_grad():
        probs = torch.softmax(server.model(torch.tensor([ids])).logits[0, -1], -1)
    top = torch.topk(probs, 3).indices.tolist()
    counts = torch.tensor([sum(d[0] == t for d in draws) for t in top], dtype=torch.float)
    expected = 400 * probs[top]
    assert (((counts - expected) / expected.sqrt()).abs() < 3 * (1 - probs[top]).sqrt() + 1e-6).all(), (
        counts,
        expected,
    )


def test_seeded_sampling_never_picks_a_masked_token_and_follows_the_distribution():
    """The inverse-CDF draw at its edges: u = 0 and u just below 1 land on tokens of positive probability when
    top-k/top-p masking zeroes the first and last tokens, and many draws follow the softmax (chi-square, 3 sd)."""
    from tba_ext.cpu.hf_rollout import _SeededSampling

    scores = torch.tensor([[float("-inf"), 0.0, 1.0, float("-inf"), 2.0, float("-inf")]])
    edges = _SeededSampling(torch.tensor([[0.0], [1.0 - 2**-24]]))(None, scores.expand(2, -1))
    assert edges.argmax(-1).tolist() == [1, 4]
    n = 20000
    picks = _SeededSampling(torch.rand(n, 1, generator=torch.Generator().manual_seed(0)))(None, scores.expand(n, -1))
    counts = torch.bincount(picks.argmax(-1), minlength=6).float()
    expected = n * torch.softmax(scores[0], -1)
    assert counts[[0, 3, 5]].sum() == 0
    kept = [1, 2, 4]
    assert (((counts[kept] - expected[kept]) / expected[kept].sqrt()).abs() < 3).all(), (counts, expected)


def test_a_searcher_scores_its_samples_with_the_initial_model_after_its_weights_moved(tiny_run):
    """reference=True: every sampled response comes with the initial model's log-probs at the sampling
    temperature (TBA's searcher), from a copy the trainer's weight updates never touch."""
    from transformers import AutoModelForCausalLM

    from tba_ext.core.wire import SEARCHER_REFERENCE
    from tba_ext.cpu.hf_rollout import HFCPUServer

    server = HFCPUServer(str(tiny_run / "model"), prompt_length=32, response_length=8, seed=0, reference=True)
    initial = AutoModelForCausalLM.from_pretrained(tiny_run / "model", dtype=torch.float32).eval()
    ids, temperature = list(prompt_ids(tiny_run)), 0.7

    async def run():
        await server.generate(ids, {"temperature": temperature}, "warm")  # the batch loop runs from here on
        await server.load_weights(
            {k: v + 0.05 * torch.randn_like(v) for k, v in server.model.state_dict().items()}, global_steps=3
        )
        sampled = await asyncio.gather(*[server.generate(ids, {"temperature": temperature}, f"r{i}") for i in range(4)])
        return sampled, await server.generate(ids, {"temperature": 0.0}, "g")

    sampled, greedy = asyncio.run(run())
    for out in sampled:
        seq = torch.tensor([ids + out.token_ids])
        with torch.no_grad():
            logits = initial(seq).logits[0, len(ids) - 1 : -1] / temperature
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        reference = torch.tensor(out.extra_fields[SEARCHER_REFERENCE])
        assert torch.allclose(reference, expected, atol=1e-5)
        assert not torch.allclose(torch.tensor(out.log_probs), reference, atol=1e-3)  # the policy moved, not it
    assert SEARCHER_REFERENCE not in greedy.extra_fields  # validation (greedy) samples are not trained on


def test_weight_update_changes_generation_and_version(tiny_run, server, tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TBA_EXT_ROLLOUT_TRACE", str(trace))
    ids = list(prompt_ids(tiny_run))
    greedy = {"temperature": 0.0, "logprobs": True}

    async def run():
        before = await server.generate(ids, dict(greedy), "a")
        state = {k: torch.randn_like(v) for k, v in server.model.state_dict().items()}
        await server.load_weights(state, global_steps=7)
        after = await server.generate(ids, dict(greedy), "b")
        return before, after

    before, after = asyncio.run(run())
    assert before.extra_fields["global_steps"] == 0  # the model directory's weights are version 0
    assert after.extra_fields["global_steps"] == 7
    assert before.log_probs != after.log_probs
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [e["event"] for e in lines] == [
        "generate_begin",
        "generate_end",
        "weights",
        "generate_begin",
        "generate_end",
    ]
    assert lines[2]["global_steps"] == 7


def test_weights_received_during_a_batch_apply_after_it_without_waiting(tiny_run, server, tmp_path, monkeypatch):
    """The trainer's weight sync does not wait for a running batch: load_weights returns while the batch still
    holds the model; that batch finishes (and is stamped) with its own weights, the next uses the new ones."""
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TBA_EXT_ROLLOUT_TRACE", str(trace))
    ids = list(prompt_ids(tiny_run))
    greedy = {"temperature": 0.0, "logprobs": True}

    async def run():
        first = asyncio.ensure_future(server.generate(ids, dict(greedy), "a"))
        while not server.model_lock.locked():  # the batch has started in its thread
            await asyncio.sleep(0.001)
        state = {k: torch.randn_like(v) for k, v in server.model.state_dict().items()}
        await server.load_weights(state, global_steps=3)
        returned_during_batch = server.model_lock.locked() and not first.done()
        second = await server.generate(ids, dict(greedy), "b")
        return returned_during_batch, await first, second

    returned_during_batch, first, second = asyncio.run(run())
    assert returned_during_batch
    assert first.extra_fields["global_steps"] == 0 and second.extra_fields["global_steps"] == 3
    assert [json.loads(x)["event"] for x in trace.read_text().splitlines()] == [
        "generate_begin",
        "generate_end",
        "weights",
        "generate_begin",
        "generate_end",
    ]
    with pytest.raises(RuntimeError, match="unexpected=\\['nope'\\]"):
        asyncio.run(server.load_weights({**state_of(server), "nope": torch.zeros(1)}, global_steps=4))


def state_of(server):
    return {k: v.clone() for k, v in server.model.state_dict().items()}


def test_server_refuses_a_missing_model_dir(tmp_path):
    from tba_ext.cpu.hf_rollout import HFCPUServer

    with pytest.raises(FileNotFoundError, match="actor_rollout_ref.model.path"):
        HFCPUServer(str(tmp_path / "nope"), 32, 8, 0)


@pytest.mark.parametrize(
    "model,refused",
    [
        ({"lora_rank": 8, "lora": {"merge": False}}, True),
        ({"lora_rank": 0, "lora": {"rank": 8}}, True),
        ({"lora_rank": 0, "lora_adapter_path": "/adapter", "lora": {}}, True),
        ({"lora_rank": 8, "lora": {"merge": True}}, False),
        ({"lora_rank": 0, "lora": {"merge": False}}, False),
    ],
)
def test_hfcpu_takes_a_lora_run_only_with_the_adapter_merged(model, refused):
    """verl sends a LoRA run's adapter on its own unless model.lora.merge: hfcpu loads full weights only, so the
    preflight refuses, naming the key."""
    from tba_ext.cpu.hf_rollout import check_hfcpu_lora

    if refused:
        with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.lora\.merge=True"):
            check_hfcpu_lora(model)
    else:
        check_hfcpu_lora(model)


@pytest.mark.e2e  # starts Ray: the unit lane does not
def test_weight_mailbox_hands_the_receiver_the_version_it_waits_for():
    """The CPU checkpoint engine's receiver blocks until its version is published (no poll interval added to
    each sync), takes that version's weights, not an earlier one, and names a version that never comes."""
    import tempfile

    import ray

    from tba_ext.cpu.ray_checkpoint_engine import RayObjectStoreCheckpointEngine

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100_000_000,
        _temp_dir=tempfile.mkdtemp(prefix="tba_ray_t_", dir="/tmp"),
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    try:

        @ray.remote
        def receive(version):
            weights = RayObjectStoreCheckpointEngine(timeout_s=60).receive_weights(global_steps=version)
            return {name: tensor.tolist() for name, tensor in weights}

        sender = RayObjectStoreCheckpointEngine(is_master=True)
        sender.init_process_group(rank=0, role="sender")
        pending = receive.remote(3)
        asyncio.run(sender.send_weights(iter([("w", torch.ones(2))]), global_steps=2))
        assert ray.wait([pending], timeout=2)[0] == []  # version 2 is not the one it waits for
        asyncio.run(sender.send_weights(iter([("w", torch.full((2,), 3.0))]), global_steps=3))
        assert ray.get(pending, timeout=60) == {"w": [3.0, 3.0]}
        with pytest.raises(TimeoutError, match="version 9 .*newest: 3"):
            list(RayObjectStoreCheckpointEngine(timeout_s=0.5).receive_weights(global_steps=9))
    finally:
        ray.shutdown()
