"""SGLang's own frontend (``sglang==0.4.10.post2``, installed ``--no-deps`` by the Makefile) against a live
``radixrt serve`` through ``sgl.RuntimeEndpoint``: the wire contract of ``/generate`` as SGLang's client
speaks it (it sends ``n``, ``spaces_between_special_tokens`` and ``None`` for unset keys on every call).
Greedy outputs of SmolLM2-135M-Instruct are asserted exactly."""

from __future__ import annotations

import json

import pytest
import sglang as sgl  # make test installs sglang==0.4.10.post2 --no-deps (see the Makefile)


@pytest.fixture(scope="module")
def backend(api_server):
    # SmolLM2's template is ChatML; the frontend renders roles itself with the named template
    b = sgl.RuntimeEndpoint(api_server.url, chat_template_name="chatml")
    sgl.set_default_backend(b)
    return b


@pytest.fixture(autouse=True)
def _idle(api_server):
    yield
    api_server.wait_idle()


@sgl.function
def capital(s, country):
    s += f"The capital of {country} is" + sgl.gen("city", max_tokens=16, stop=".", temperature=0)


def test_gen_with_stop(backend):
    st = capital.run(country="France")
    assert st["city"] == " Paris"
    meta = st.get_meta_info("city")
    assert meta["finish_reason"] == {"type": "stop", "matched": "."}
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 2


@sgl.function
def pick(s):
    s += "The capital of France is " + sgl.select("c", choices=["Paris", "London", "Berlin"])


def test_select(backend):
    assert pick.run()["c"] == "Paris"


@sgl.function
def two_capitals(s):
    s += "Facts.\n"
    fs = s.fork(2)
    for f, c in zip(fs, ["France", "Italy"]):
        f += f"The capital of {c} is" + sgl.gen("x", max_tokens=8, stop=".", temperature=0)
    fs.join()
    s += "Both: " + fs[0]["x"] + " and " + fs[1]["x"]


def test_fork_join(backend):
    assert two_capitals.run().text() == "Facts.\nBoth:  Paris and  Rome"


@sgl.function
def legs(s):
    s += "Q: How many legs does a dog have? A: " + sgl.gen("n", regex=r"[0-9]+", max_tokens=4, temperature=0)


def test_regex(backend):
    assert legs.run()["n"] == "1000"


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@sgl.function
def person(s):
    s += "Give a person as JSON: " + sgl.gen("j", json_schema=json.dumps(PERSON), max_tokens=48, temperature=0)


def test_json_schema(backend):
    out = person.run()["j"]
    assert out == '{"name":"John","age":25}'
    assert json.loads(out) == {"name": "John", "age": 25}


def test_run_batch(backend):
    states = capital.run_batch([{"country": "Italy"}, {"country": "Japan"}, {"country": "France"}])
    assert [s["city"] for s in states] == [" Rome", " Tokyo", " Paris"]


def test_stream(backend):
    st = capital.run(country="Spain", stream=True)
    chunks = list(st.text_iter("city"))
    assert "".join(chunks) == " Madrid" == st["city"]


@sgl.function
def chat(s, q):
    s += sgl.system("You are terse.")
    s += sgl.user(q)
    s += sgl.assistant(sgl.gen("a", max_tokens=12, temperature=0))


def test_roles_with_chat_template(backend, api_server, tokenizer):
    st = chat.run(q="What is 2+2?")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    prompt = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert st["a"] == "Two and two is a classic math problem. It's a"
    assert st.text() == prompt + st["a"] + "<|im_end|>\n"
    # the same conversation through the OpenAI route: the same prompt, so the same greedy answer
    with api_server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 12, "temperature": 0}).json()
    assert r["choices"][0]["message"]["content"] == st["a"]


@sgl.function
def two_turns(s):
    s += sgl.system("You are a helpful assistant. " * 4)
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant(sgl.gen("a1", max_tokens=8, temperature=0))
    s += sgl.user("And of Italy?")
    s += sgl.assistant(sgl.gen("a2", max_tokens=8, temperature=0))


def test_multi_turn_reports_cached_tokens(backend):
    backend.flush_cache()
    st = two_turns.run()
    assert st["a1"] == "The capital of France is Paris."
    assert st["a2"] == "The capital of Italy is Rome."
    m1, m2 = st.get_meta_info("a1"), st.get_meta_info("a2")
    assert m1["cached_tokens"] == 0
    # the second turn's prompt extends the first one's (prompt + answer, cached at finish): whole pages hit
    assert m2["prompt_tokens"] == 68 and m2["cached_tokens"] == 48
