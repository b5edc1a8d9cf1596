"""The frontend DSL (issue 6): every primitive over ZMQ, HTTP and the in-process Engine against a real
server; fork/join; select parity with independent forward passes (edge case 12); streaming; run_batch
prefix caching; errors."""

from __future__ import annotations

import re
import time

import pytest
import torch
from pydantic import BaseModel, Field

import dsl_util
import radixrt as rt
from dsl_util import common_prefix, page_floor
from conftest import close_engine, hf_greedy, make_engine
from radixrt.lang.program import as_backend
from server_util import free_port

# drafts that do not depend on the wall clock: no cost model (it times the steps), the draft length pinned
FIXED_SPEC = {"speculative_algorithm": "suffix", "speculative_adaptive": False, "speculative_num_draft_tokens": 24}


@pytest.fixture(scope="session")
def server(request):
    srv = dsl_util.start_server(request.config)  # loads in its own process while this one loads the engine
    try:
        request.getfixturevalue("engine")
        srv.wait_ready()
        yield srv
    finally:
        dsl_util.stop_server()


@pytest.fixture(params=["zmq", "http", "engine"])
def backend(request, engine):
    if request.param == "engine":
        return as_backend(engine)
    request.getfixturevalue("server")
    return dsl_util.endpoint(request.param)


class Item(BaseModel):
    name: str = Field(pattern="^[a-z]{1,8}$")
    count: int = Field(ge=0, le=9)


@rt.function
def primitives(s):
    s += rt.system("You are a terse assistant.")
    with s.user():
        s += "Name a fruit."
    s += rt.assistant(rt.gen("fruit", max_tokens=6, stop=["\n", "."]))
    s += rt.user_begin() + "Give a digit." + rt.user_end()
    s += rt.assistant_begin()
    s += rt.gen("digit", regex=r"[0-9]", max_tokens=3)
    s += rt.assistant_end()
    s += rt.user("Is the sky blue?")
    s += rt.assistant(rt.select("yn", ["yes", "no"]))
    s += rt.user("Give an item as JSON.")
    s += rt.assistant(rt.gen("item", json_schema=Item, max_tokens=40))
    s += rt.user("A number:")
    s += rt.assistant(rt.gen("num", dtype=int, max_tokens=4))


def _stop_trimmed(text: str, stops: list[str]) -> str:
    cut = min([text.index(x) for x in stops if x in text], default=len(text))
    return text[:cut]


@pytest.fixture(scope="module")
def primitives_oracle(tokenizer, hf_model):
    """What every backend must answer for ``primitives`` at temperature 0, from sources independent of the three
    backends under test and of the order they run in: a fresh in-process Engine with neither radix cache nor
    speculation (every call prefills its whole prompt), and for the free-text call HF's own greedy tokens."""
    e = make_engine(speculative_algorithm="none", disable_radix_cache=True)
    try:
        st = primitives.run(temperature=0, backend=as_backend(e))
    finally:
        close_engine(e)
    assert st.error() is None
    got = (st["fruit"], st["digit"], st["yn"], Item.model_validate_json(st["item"]), st["num"], st.text())
    # gen("fruit", max_tokens=6, stop=["\n", "."]) after the system and user turns: HF's 6 greedy tokens up
    # to the end of turn, the text cut before the first stop string
    first = tokenizer.apply_chat_template(st.messages()[:2], tokenize=False, add_generation_prompt=True)
    ids = hf_greedy(hf_model, tokenizer.encode(first, add_special_tokens=False), 6)
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    fruit = _stop_trimmed(tokenizer.decode(ids, skip_special_tokens=True), ["\n", "."])
    return got, st.get_meta_info("yn")["scores"], fruit


def test_primitives_every_backend(backend, tokenizer, primitives_oracle):
    st = primitives.run(temperature=0, backend=backend)
    assert st.error() is None
    msgs = st.messages()
    assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * 5
    assert st.text() == tokenizer.apply_chat_template(msgs, tokenize=False)  # the model's own template
    first = tokenizer.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    m = st.get_meta_info("fruit")
    assert m["prompt_tokens"] == len(tokenizer.encode(first, add_special_tokens=False))
    assert m["completion_tokens"] <= 6 and m["finish_reason"]["type"] in ("stop", "length")
    assert "\n" not in st["fruit"] and msgs[2]["content"] == st["fruit"]
    assert re.fullmatch(r"[0-9]", st["digit"])
    assert st["yn"] in ("yes", "no") and msgs[6]["content"] == st["yn"]
    scores = st.get_meta_info("yn")["scores"]
    assert len(scores) == 2 and st["yn"] == ["yes", "no"][max(range(2), key=scores.__getitem__)]
    item = Item.model_validate_json(st["item"])
    assert re.fullmatch(r"[-+]?[0-9]+", st["num"])
    got = (st["fruit"], st["digit"], st["yn"], item, st["num"], st.text())
    want, want_scores, hf_fruit = primitives_oracle
    assert st["fruit"] == hf_fruit  # HF's greedy text
    assert got == want  # greedy: the same text over ZMQ, HTTP and in-process as the uncached engine's
    assert scores == pytest.approx(want_scores, abs=1e-4)


@rt.function
def story(s, spec=None):
    s += rt.user("Tell me a story about a cat.")
    s += rt.assistant(rt.gen("story", max_tokens=8, ignore_eos=True, speculative=spec))


def test_streaming(backend):
    assert rt.flush_cache(backend)
    # streamed without speculation: one token a step. With it, a step emits as many tokens as its drafts
    # kept (the server's cost model decides from measured step times; the story another backend of this
    # server wrote would be drafted and verified by the prefill itself), so all 8 may come in one chunk.
    st = story.run(spec=False, temperature=0, stream=True, backend=backend)
    chunks = list(st.text_iter("story"))
    assert st.error() is None and len(chunks) >= 2
    assert "".join(chunks) == st["story"] and st.get_meta_info("story")["completion_tokens"] == 8
    st2 = story.run(spec=False, temperature=0, stream=True, backend=backend)
    assert "".join(st2.text_iter()) == st2.text() == st.text()
    assert story.run(temperature=0, backend=backend)["story"] == st["story"]  # speculation on (the default)


@rt.function
def forked(s, long_text):
    s += long_text
    f = s.fork(3)
    f += lambda i: [" Alpha", " Beta", " Gamma"][i] + rt.gen("next", max_tokens=3, temperature=0)
    f.join()
    g = s.fork(2)
    g += lambda i: f" [{i}]"
    g.join("concate_and_append")


def test_fork_join(server, tokenizer):
    b = dsl_util.endpoint("zmq")
    assert b.flush_cache()
    text = "Once upon a time, in a quiet village by the sea, there lived an old fisherman and his cat. " * 3
    st = forked.run(long_text=text, backend=b)
    assert st.error() is None
    assert isinstance(st["next"], list) and len(st["next"]) == 3
    metas = st.get_meta_info("next")
    n = len(tokenizer.encode(text, add_special_tokens=False))
    for m in metas:  # the shared text was prefilled once, before the children ran
        assert m["cached_tokens"] >= page_floor(n - 1) > 0
    assert st.text() == text + " [0] [1]"


@rt.function
def fork_first(s, then_gen):
    f = s.fork(2)
    if then_gen:
        f += rt.gen("x", max_tokens=2)
    else:
        f += lambda i: f"Say {i}:" + rt.gen("x", max_tokens=2, temperature=0)
    f.join()


def test_fork_before_any_text(engine):
    b = as_backend(engine)
    st = fork_first.run(then_gen=False, backend=b)
    assert st.error() is None and len(st["x"]) == 2
    st = fork_first.run(then_gen=True, backend=b)
    assert isinstance(st.error(), ValueError) and "gen('x'): nothing to continue" in str(st.error())
    st = rt.function(lambda s: s.fork(0)).run(backend=b)
    assert isinstance(st.error(), ValueError) and "fork size must be a positive integer" in str(st.error())


def _hf_logprobs(hf_model, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1, from one full forward pass."""
    with torch.no_grad():
        lp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


EDGE12 = [
    ("The capital of France is ", ["Paris", "Antidisestablishmentarianism"]),
    ("Question: Is the sun hot?\nAnswer: ", ["Yes", "Yes, definitely"]),
    ("My favourite pet is a ", ["cat", "category"]),
]


def _greedy(cond: list[list[float]]) -> int:
    """SGLang's greedy_token_selection, written independently: pad short options with their mean, then the
    first position with a unique maximum decides. HF scores each option in its own forward pass, so the
    same token after the same context can differ by float noise (~1e-6) between options: values within
    1e-5 of the best count as tied, as they are in exact arithmetic (and in radixrt, which computes them
    with the same kernel: bit-equal)."""
    w = max(map(len, cond))
    rows = [r + [sum(r) / len(r)] * (w - len(r)) for r in cond]
    alive = list(range(len(rows)))
    for j in range(w):
        best = max(rows[i][j] for i in alive)
        alive = [i for i in alive if rows[i][j] >= best - 1e-5]
        if len(alive) == 1:
            break
    return alive[0]


@rt.function
def pick(s, context, choices, method):
    s += context
    s += rt.select("c", choices, choices_method=method)


@pytest.mark.parametrize(
    "method", ["token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized"]
)
@pytest.mark.parametrize("context,choices", EDGE12)
def test_select_parity_edge12(engine, hf_model, tokenizer, context, choices, method):
    b = as_backend(engine)
    bodies = []
    orig = b._request
    b._request = lambda body: (bodies.append(body), orig(body))[1]
    try:
        st = pick.run(context=context, choices=choices, method=method, backend=b)
    finally:
        del b._request
    assert st.error() is None
    meta = st.get_meta_info("c")
    ctx = tokenizer.encode(context, add_special_tokens=False)
    cond, uncond = [], []
    for i, c in enumerate(choices):
        full = tokenizer.encode(context + c, add_special_tokens=False)
        k = common_prefix(ctx, full)
        assert meta["choice_token_ids"][i] == full[k:]  # scored on exactly its own tokens
        ref = _hf_logprobs(hf_model, full)[k - 1 :]
        assert [t[0] for t in meta["input_token_logprobs"][i]] == pytest.approx(ref, abs=2e-3)
        assert meta["normalized_prompt_logprobs"][i] == pytest.approx(sum(ref) / len(ref), abs=2e-3)
        assert meta["sum_logprobs"][i] == pytest.approx(sum(ref), abs=5e-3)
        cond.append(ref)
        uncond.append([0.0] + _hf_logprobs(hf_model, full[k:]))
    if method == "greedy_token_selection":
        expect = [1.0 if i == _greedy(cond) else 0.0 for i in range(len(choices))]
    elif method == "unconditional_likelihood_normalized":
        expect = [sum(a - u for a, u in zip(r, ur)) / len(r) for r, ur in zip(cond, uncond)]
    else:
        expect = [sum(r) / len(r) for r in cond]
    if method != "greedy_token_selection":
        assert meta["scores"] == pytest.approx(expect, abs=4e-3)
    assert st["c"] == choices[max(range(len(choices)), key=expect.__getitem__)]  # the argmax of the method
    if choices[0] == "Paris" and method != "unconditional_likelihood_normalized":
        assert st["c"] == "Paris"
    assert st.text() == context + st["c"]
    first = bodies[0]  # ONE batched prefill-only request over the shared context
    assert len(first["input_ids"]) == len(choices) and first["sampling_params"]["max_new_tokens"] == 0
    assert first["logprob_start_len"] == min(common_prefix(ctx, x) for x in first["input_ids"])
    assert len(bodies) == (2 if method == "unconditional_likelihood_normalized" else 1)


LONG_SYSTEM = "You are a careful assistant that answers with one short number. " * 8


@rt.function
def numbered(s, i):
    s += rt.system(LONG_SYSTEM)
    s += rt.user(f"Repeat the number {i}.")
    s += rt.assistant(rt.gen("out", max_tokens=2, temperature=0))
    if i == 7:
        raise RuntimeError("boom 7")


def test_run_batch_prefix_cached(server, tokenizer):
    b = dsl_util.endpoint("zmq")
    assert b.flush_cache()
    prefix = numbered.trace_prefix(b)
    # the f-string argument of rt.user() is evaluated first: the trace stops before the user message
    assert prefix == tokenizer.apply_chat_template([{"role": "system", "content": LONG_SYSTEM}], tokenize=False)
    states = numbered.run_batch([{"i": i} for i in range(32)], backend=b, num_threads=32, progress_bar=True)
    assert len(states) == 32
    pre = tokenizer.encode(prefix, add_special_tokens=False)
    for i, st in enumerate(states):
        if i == 7:  # its exception is on its state; the other 31 ran through
            assert isinstance(st.error(), RuntimeError) and str(st.error()) == "boom 7"
            continue
        assert st.error() is None
        m = st.get_meta_info("out")
        prompt = tokenizer.apply_chat_template(st.messages()[:2], tokenize=False, add_generation_prompt=True)
        full = tokenizer.encode(prompt, add_special_tokens=False)
        assert m["prompt_tokens"] == len(full)
        assert m["cached_tokens"] >= page_floor(common_prefix(pre, full)) >= 96  # the prefix was prefilled first


def test_errors(backend):
    @rt.function
    def bad(s, kind):
        s += "Value: "
        if kind == "regex":
            s += rt.gen("num", regex="((", max_tokens=2)
        elif kind == "huge":  # compiles; the backend's lexer gives up once it runs
            s += rt.gen("num", regex="a{99999999}", max_tokens=2)
        else:
            s += rt.gen("obj", json_schema={"type": "string", "pattern": "(("}, max_tokens=2)
        s += "never"

    e = bad.run(kind="regex", backend=backend).error()
    assert isinstance(e, rt.RequestError) and str(e).startswith("gen('num'): regex") and "((" in str(e)
    e = bad.run(kind="huge", backend=backend).error()
    assert isinstance(e, rt.RequestError) and str(e).startswith("gen('num'): regex: the grammar cannot be used"), e
    st = bad.run(kind="schema", backend=backend)
    assert str(st.error()).startswith("gen('obj'): json_schema") and "never" not in st.text()
    with pytest.raises(RuntimeError, match="program failed"):
        st["obj"]


def test_api_errors_and_down_backend():
    with pytest.raises(ValueError, match=r"gen\('x'\): give at most one"):
        rt.gen("x", regex="a", json_schema={"type": "string"})
    with pytest.raises(ValueError, match=r"gen\('x'\): give choices or one of regex"):
        rt.gen("x", regex="[0-9]+", choices=["a"])  # the regex was silently dropped
    with pytest.raises(ValueError, match=r"gen\('x'\): json_schema must be"):
        rt.gen("x", json_schema=3)
    with pytest.raises(ValueError, match=r"select\('y'\): choices"):
        rt.select("y", [])
    for url in (f"tcp://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"):
        t0 = time.time()
        with pytest.raises(rt.BackendConnectionError, match="radixrt server"):
            rt.RuntimeEndpoint(url, connect_timeout=1.0)
        assert time.time() - t0 < 5
    assert rt.Engine.__module__ == "radixrt.runtime.engine" and rt.function is rt.lang.api.function


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": -1}, "max_tokens must be in [0, inf], got -1"),
        ({"max_tokens": "5"}, "max_tokens must be an int, got '5'"),
        ({"max_tokens": 1.5}, "max_tokens must be an int, got 1.5"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens (5) must be <= max_tokens (2)"),
        ({"temperature": -1}, "temperature must be in [0, inf], got -1"),
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"top_p": 2}, "top_p must be in (0, 1], got 2"),
        ({"top_k": 0}, "top_k must be -1 (off) or >= 1, got 0"),
        ({"stop": 5}, "stop must be a non-empty string or a list of them, got 5"),
        ({"stop": [""]}, "stop must be a non-empty string or a list of them, got ['']"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be a list of token ids (ints >= 0), got [-1]"),
        ({"ignore_eos": 1}, "ignore_eos must be a bool, got 1"),
    ],
)
def test_sampling_arguments_are_checked_where_written(kwargs, message):
    """The server's ranges, as a ValueError naming the argument when ``gen`` is written (not a RequestError
    on ``state.error()`` once the program reaches it)."""
    with pytest.raises(ValueError) as e:
        rt.gen("x", **kwargs)
    assert str(e.value) == f"gen('x'): {message}"


def test_select_and_run_arguments_are_checked():
    with pytest.raises(ValueError) as e:
        rt.select("y", ["a", "a"])
    assert str(e.value) == "select('y'): choices must differ, got ['a', 'a']"
    with pytest.raises(ValueError) as e:
        rt.select("y", ["a", "b"], temperature=-1)
    assert str(e.value) == "select('y'): temperature must be in [0, inf], got -1"

    @rt.function
    def quiz(s):
        s += "Q: " + rt.gen("a", max_tokens=2)

    with pytest.raises(ValueError) as e:
        quiz.run(max_new_tokens=-5, backend=object())
    assert str(e.value) == "max_new_tokens must be in [0, inf], got -5"


def test_gen_speculative_opt_out():
    """``gen(speculative=False)``: that call verifies no drafts (its sampling_params carry the opt-out);
    the same tokens as with the engine's speculation (without the cost model, which decides from measured
    step times whether a draft is verified at all)."""

    @rt.function
    def repeat(s, spec):
        s += "Repeat: one two three four five six seven eight. Repeat: one two three four five six seven eight. Repeat:"
        s += rt.gen("out", max_tokens=12, temperature=0, speculative=spec)

    engine = make_engine(**FIXED_SPEC)
    try:
        steps = lambda: engine.get_server_info()["cache"]["speculative"]["verify_steps"]  # noqa: E731
        b = as_backend(engine)
        v0 = steps()
        on = repeat.run(spec=None, backend=b)
        v1 = steps()
        off = repeat.run(spec=False, backend=b)
        assert steps() == v1 > v0  # the copied words are drafted with speculation, none without
    finally:
        close_engine(engine)
    assert off["out"] == on["out"] == " one two three four five six seven eight.\n\nThis"
    assert rt.gen("x", speculative=False).sampling_params.to_srt() == {"speculative": False}
    with pytest.raises(ValueError, match=r"gen\('x'\): speculative must be a bool, got 'no'"):
        rt.gen("x", speculative="no")


def test_openai_backend(server):
    oa = rt.OpenAI(base_url=server.url + "/v1", model="SmolLM2-135M-Instruct")
    st = story.run(temperature=0, backend=oa)
    assert st.error() is None and st["story"] == story.run(temperature=0, backend=dsl_util.endpoint("zmq"))["story"]
    st = primitives.run(temperature=0, backend=oa)
    assert "regex (and dtype) constrained generation is not supported by the OpenAI backend" in str(st.error())
    sel = rt.function(lambda s: (s.__iadd__("Pick: "), s.__iadd__(rt.select("c", ["a", "b"]))))
    assert "select is not supported by the OpenAI backend" in str(sel.run(backend=oa).error())
