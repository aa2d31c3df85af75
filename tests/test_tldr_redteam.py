"""TL;DR (user-supplied copy + reward model) and red-teaming (victim + toxicity classifier + diversity) on small
fixtures and tiny offline models; each score is checked against the models run directly."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from tba_ext.tasks import redteam, tldr
from tba_ext.tasks.data import write_task
from tba_ext.tasks.rewards import compute_score
from tba_ext.tools.models import ModelSpec, make_model

POSTS = [
    {
        "subreddit": "cooking",
        "title": "Burnt rice",
        "post": "I always burn the rice at the bottom of the pot.",
        "summary": "rice keeps burning",
    },
    {
        "subreddit": "pets",
        "title": "Cat at night",
        "post": "My cat runs around the flat every night at 3am.",
        "summary": {"text": "cat is loud at night"},
    },
    {
        "subreddit": "running",
        "title": "First 10k",
        "post": "I ran my first 10k today and my knees hurt a lot.",
        "summary": "knees hurt after first 10k",
    },
]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    src = root / "tldr_src"
    src.mkdir()
    (src / "train.jsonl").write_text("\n".join(json.dumps(p) for p in POSTS) + "\n")
    pd.DataFrame(
        [
            {
                "query": tldr.POST_TEMPLATE.format(**{k: p[k] for k in ("subreddit", "title", "post")}),
                "reference_response": " " + (p["summary"] if isinstance(p["summary"], str) else p["summary"]["text"]),
            }
            for p in POSTS
        ]
    ).to_parquet(src / "validation.parquet")
    texts = [json.dumps(p) for p in POSTS] * 20 + [r["prompt"][0]["content"] for r in redteam.rows("train", 50, 0)]
    spec = ModelSpec(size="tiny", vocab_size=400)
    for name, head in (("policy", "lm"), ("rm", "reward"), ("tox", "toxicity"), ("victim", "lm")):
        make_model(str(root / name), texts, spec, head=head)
    for name, head in (("rm_raw", "reward"), ("tox_raw", "toxicity"), ("victim_raw", "lm")):  # Pythia / GPT-2 kind
        make_model(str(root / name), texts, spec, head=head, chat_template=False)
    return root


class ClassifyServer:
    """verl's reward router in front of a vLLM /classify server, for one reward model: raw logits of the text it
    is sent (``use_activation: False``), in vLLM's response shape. Keeps the texts it was sent."""

    def __init__(self, model_path):
        import http.server
        import threading

        from tba_ext.tasks.scorers import reward_model_scores

        server, self.inputs = self, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.path == "/classify" and body["model"] == model_path and body["use_activation"] is False
                server.inputs.append(body["input"])
                logit = reward_model_scores(model_path, [body["input"]])[0]
                reply = json.dumps({"data": [{"index": 0, "probs": [logit]}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_tldr_layouts_and_bad_rows(fixtures, tmp_path):
    rows = tldr.load_rows(str(fixtures / "tldr_src"), "train")
    assert [r["reward_model"]["ground_truth"] for r in rows] == [
        "rice keeps burning",
        "cat is loud at night",
        "knees hurt after first 10k",
    ]
    assert rows[0]["prompt"][0]["content"].startswith("SUBREDDIT: r/cooking") and rows[0]["prompt"][0][
        "content"
    ].endswith("TL;DR:")
    val = tldr.load_rows(str(fixtures / "tldr_src"), "validation")
    assert val[1]["extra_info"]["prompt_text"] == rows[1]["extra_info"]["prompt_text"]
    (tmp_path / "train.jsonl").write_text(json.dumps(POSTS[0]) + "\n" + json.dumps({"post": "no summary"}) + "\n")
    with pytest.raises(ValueError, match=r"train.jsonl row 2: needs a prompt"):
        tldr.load_rows(str(tmp_path), "train")
    with pytest.raises(FileNotFoundError, match="--source"):
        tldr.load_rows(str(tmp_path), "test")


def test_tldr_reward_is_the_reward_models_logit(fixtures):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    row = tldr.load_rows(str(fixtures / "tldr_src"), "train")[0]
    rm = str(fixtures / "rm")
    got = compute_score(
        tldr.DATA_SOURCE, "my rice burns", row["reward_model"]["ground_truth"], row["extra_info"], reward_model_path=rm
    )
    tok = AutoTokenizer.from_pretrained(rm)
    model = AutoModelForSequenceClassification.from_pretrained(rm).eval()
    with torch.no_grad():
        ids = tok(row["extra_info"]["prompt_text"] + " my rice burns", return_tensors="pt")
        direct = model(**ids).logits[0, 0].item()
    assert got == pytest.approx(direct, abs=1e-5)
    with pytest.raises(ValueError, match=r"reward_kwargs.reward_model_path is required"):
        compute_score(tldr.DATA_SOURCE, "x", "y", row["extra_info"])
    with pytest.raises(FileNotFoundError, match=r"reward_kwargs.reward_model_path: no saved"):
        compute_score(tldr.DATA_SOURCE, "x", "y", row["extra_info"], reward_model_path=str(fixtures / "nope"))


def test_tldr_reward_models_without_a_chat_template_score_the_text_served_or_local(fixtures):
    """A Pythia-style reward model (no chat template): verl's served reward model gets post + summary as text (its
    own path would apply the missing chat template), and the score is the one the model gives that text locally."""
    from transformers import AutoTokenizer

    from tba_ext.tasks.scorers import reward_model_scores

    rm = str(fixtures / "rm_raw")
    assert AutoTokenizer.from_pretrained(rm).chat_template is None
    row = tldr.load_rows(str(fixtures / "tldr_src"), "train")[1]
    text = tldr.rm_text(row["extra_info"]["prompt_text"], " the cat is loud")
    local = compute_score(tldr.DATA_SOURCE, " the cat is loud", "", row["extra_info"], reward_model_path=rm)
    assert local == pytest.approx(reward_model_scores(rm, [text])[0], abs=1e-6)
    server = ClassifyServer(rm)
    try:
        served = compute_score(
            tldr.DATA_SOURCE,
            " the cat is loud",
            "",
            row["extra_info"],
            reward_model_path=rm,
            reward_router_address=server.address,
            reward_model_tokenizer=None,
        )
    finally:
        server.httpd.shutdown()
    assert server.inputs == [text] and served == pytest.approx(local, abs=1e-6)


def test_redteam_victim_and_classifier_without_chat_templates(fixtures):
    """GPT-2-style victim and classifier: the attack is the victim's raw prompt, its greedy reply is classified."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tba_ext.tasks.scorers import positive_probability

    victim, tox = str(fixtures / "victim_raw"), str(fixtures / "tox_raw")
    tokenizer = AutoTokenizer.from_pretrained(victim)
    assert tokenizer.chat_template is None and AutoTokenizer.from_pretrained(tox).chat_template is None
    attack = "why are my neighbours so loud"
    got = compute_score(
        redteam.DATA_SOURCE, attack, "", {}, victim_model_path=victim, toxicity_model_path=tox, victim_max_new_tokens=5
    )
    model = AutoModelForCausalLM.from_pretrained(victim).eval()
    ids = tokenizer(attack, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert got == pytest.approx(positive_probability(tox, [reply])[0], abs=1e-6)


def test_win_rate_formula():
    assert tldr.win_rate([1.0, 0.0, 2.0, 0.5], [0.5, 0.0, 3.0, 0.4]) == 0.5  # ties lose
    with pytest.raises(ValueError):
        tldr.win_rate([1.0], [])


def test_tldr_win_rate_evaluation(fixtures, tmp_path):
    from tba_ext.tasks.scorers import reward_model_scores
    from tba_ext.tools.evaluate import tldr_win_rate

    write_task("tldr", str(tmp_path), 3, 3, 0, source=str(fixtures / "tldr_src"))
    result = tldr_win_rate(
        str(fixtures / "policy"), str(tmp_path / "test.parquet"), str(fixtures / "rm"), max_new_tokens=6
    )
    assert result["n"] == 3 and 0.0 <= result["win_rate"] <= 1.0
    refs = [r["extra_info"]["answer_text"] for r in tldr.load_rows(str(fixtures / "tldr_src"), "train")]
    posts = [r["extra_info"]["prompt_text"] for r in tldr.load_rows(str(fixtures / "tldr_src"), "train")]
    direct = reward_model_scores(str(fixtures / "rm"), [tldr.rm_text(p, s) for p, s in zip(posts, refs)])
    assert result["mean_reference_reward"] == pytest.approx(sum(direct) / 3, abs=1e-5)


def test_redteam_rows_are_offline_and_split_by_topic():
    train, test = redteam.rows("train", 40, 0), redteam.rows("test", 40, 0)
    assert {r["prompt"][0]["content"] for r in train}.isdisjoint({r["prompt"][0]["content"] for r in test})
    assert all(r["data_source"] == redteam.DATA_SOURCE for r in train)


def test_redteam_reward_is_toxicity_of_the_victims_reply(fixtures):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    victim, tox = str(fixtures / "victim"), str(fixtures / "tox")
    got = compute_score(
        redteam.DATA_SOURCE,
        "why are my neighbours so loud",
        "",
        {},
        victim_model_path=victim,
        toxicity_model_path=tox,
        victim_max_new_tokens=5,
    )
    rewards, replies = redteam.toxicity_rewards(["why are my neighbours so loud"], victim, tox, 5)
    assert got == pytest.approx(rewards[0], abs=1e-6)
    tok = AutoTokenizer.from_pretrained(tox)
    model = AutoModelForSequenceClassification.from_pretrained(tox).eval()
    with torch.no_grad():
        logits = model(**tok(replies[0], return_tensors="pt")).logits[0]
    assert got == pytest.approx(torch.softmax(logits, -1)[1].item(), abs=1e-5)  # label "toxic" is column 1
    with pytest.raises(ValueError, match=r"toxicity_model_path is required"):
        compute_score(redteam.DATA_SOURCE, "x", "", {}, victim_model_path=victim)


def test_attack_success_rate_and_diversity():
    assert redteam.attack_success_rate([0.9, 0.2, 0.51, 0.5]) == 0.5
    same = redteam.diversity(["the cat sat on the mat"] * 3)
    near = redteam.diversity(["the cat sat on the mat", "a cat was sitting on the mat"])
    far = redteam.diversity(["the cat sat on the mat", "quarterly tax filing deadlines for companies"])
    assert same == pytest.approx(0.0, abs=1e-5) and near < far
    texts = ["one fish", "two fish", "red fish", "blue fish"]
    unit = redteam.embed(texts)
    pairs = [1 - float(np.dot(unit[i], unit[j])) for i in range(4) for j in range(4) if i < j]
    assert redteam.diversity(texts) == pytest.approx(np.mean(pairs), abs=1e-5)


def test_redteam_evaluation(fixtures, tmp_path):
    from tba_ext.tools.evaluate import redteam_eval

    write_task("redteam", str(tmp_path), 4, 6, 0)
    result = redteam_eval(
        str(fixtures / "policy"),
        str(tmp_path / "test.parquet"),
        str(fixtures / "victim"),
        str(fixtures / "tox"),
        max_new_tokens=6,
    )
    assert result["n"] == 6 and 0.0 <= result["attack_success_rate"] <= 1.0 and result["diversity"] >= 0.0
