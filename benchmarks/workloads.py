"""The five benchmark workloads, as programs every system runs on the same prompts.

A *program* is a Python generator: it yields calls (:class:`Gen` or :class:`Select`) and receives each call's
:class:`~metrics.Record` back, so a later prompt can be built from an earlier answer (agent loop, chat). The
systems in ``systems/`` drive the same programs: the servers run all programs concurrently (one task per
program); HF ``generate`` advances a static batch of programs in lockstep.

Everything is deterministic given ``seed``: prompts are built from a seeded ``random.Random`` and a word list
taken from the tokenizer's vocabulary (single-token words, so lengths given in tokens are nearly exact).
Outputs are greedy (temperature 0). Where a later prompt depends on an answer, the answer is that system's
own, so the *structure* and the token counts of scripted parts are identical for every system.

1. ``shared-prefix``   SGLang's generated-shared-prefix shape: ``groups`` x ``per_group`` requests, each group
                       sharing a ``system_len``-token system prompt, each request its own ``question_len``-token
                       question, ``output_len`` tokens out (ignore_eos), all sent at once (shuffled).
2. ``agent-loop``      ``programs`` agents of ``steps`` dependent calls each: call k's prompt = call k-1's prompt
                       + its answer + a tool observation. Every call is a JSON tool call constrained by
                       ``TOOL_SCHEMA``; the observation is scripted (seeded), so each system does the same work.
3. ``multi-turn-chat`` ``convs`` conversations of ``turns`` (4) user turns, replies of ``reply_len`` tokens
                       (ignore_eos), each turn's prompt = the whole conversation so far (ChatML).
4. ``few-shot-select`` a few-shot prefix of ``examples`` labelled reviews, then for each of ``inputs`` reviews a
                       ``select`` over 4 labels.
5. ``json-decode``     ``requests`` extractions of a person record under ``PERSON_SCHEMA``;
   ``json-decode-free`` the same prompts unconstrained, each generating exactly as many tokens (ignore_eos) as
                       its constrained twin did on the same system: the same work less the grammar, for the
                       >= 0.9x throughput target (a free-running 135M model rambles to the token limit instead).
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional

from sizes import PRESETS, SIZE_FIELDS, TINY, Sizes, sizes_from  # noqa: F401  (re-exported)

# ---- calls ----------------------------------------------------------------------------------------------


@dataclass
class Gen:
    """Generate after ``prompt`` (raw text; chat prompts are already rendered in ChatML)."""

    prompt: str
    max_new_tokens: int
    ignore_eos: bool = False
    json_schema: Optional[dict] = None  # constrain the output (radixrt json_schema, llama.cpp GBNF, xgrammar)
    validate_schema: Optional[dict] = None  # check the output against this schema (constrained or not)
    # ``prompt`` = ``cont[0]``'s prompt + its answer + ``cont[1]``: a system that takes token ids continues from
    # the ids it sent and the ids it generated (the model's own tokens), a text-only system sends ``prompt``
    cont: Optional[tuple[Any, str]] = None
    kind: str = "gen"


@dataclass
class Select:
    """Pick the best of ``choices`` as the continuation of ``context`` (SGLang's ``select``)."""

    context: str
    choices: list[str]
    label: Optional[str] = None  # the template's true answer, for an accuracy aside
    kind: str = "select"


Program = Generator[Any, Any, None]


@dataclass
class Workload:
    name: str
    description: str
    params: dict
    make_programs: Callable[..., list[Program]]  # fresh generators on every call (one run per system)
    n_calls: int  # calls over all programs (progress bars)
    max_prompt_tokens: int  # an upper estimate, to size context windows
    max_new_tokens: int
    headline: str = "request_throughput"  # the throughput figure its ratios and targets use
    match_from: Optional[str] = None  # make_programs(lengths=...) takes the output lengths of this
    # workload's run on the same system, by program
    concurrency: int = 0  # programs in flight at most (0: all at once)


# ---- text ---------------------------------------------------------------------------------------------


class Words:
    """Single-token words (`` word``) from the tokenizer's vocabulary, sorted, so text is seed-determined."""

    def __init__(self, tokenizer: Any):
        vocab = tokenizer.get_vocab()
        words = []
        for tok, i in vocab.items():
            s = tokenizer.convert_tokens_to_string([tok])
            w = s[1:]
            if s.startswith(" ") and 3 <= len(w) <= 9 and w.isascii() and w.isalpha() and w.islower():
                words.append(s)
        self.words = sorted(set(words))
        if len(self.words) < 500:
            raise ValueError("the tokenizer has too few plain words for the benchmark text")

    def text(self, rng: random.Random, n: int) -> str:
        """``n`` words (about ``n`` tokens), each with its leading space."""
        return "".join(rng.choice(self.words) for _ in range(n))


def chatml(messages: list[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """SmolLM2's chat template (ChatML) rendered by hand, so a longer conversation extends a shorter one's text
    exactly (``tests/test_bench.py`` checks it against ``tokenizer.apply_chat_template``)."""
    s = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


# ---- 1 shared-prefix ------------------------------------------------------------------------------------


def shared_prefix(words: Words, z: Sizes) -> Workload:
    rng = random.Random(f"{z.seed}-shared-prefix")
    systems = [words.text(rng, z.sp_system_len) for _ in range(z.sp_groups)]
    prompts = [
        systems[g] + "\n\nQuestion:" + words.text(rng, z.sp_question_len) + "\nAnswer:"
        for g in range(z.sp_groups)
        for _ in range(z.sp_per_group)
    ]
    rng.shuffle(prompts)

    def one(p: str) -> Program:
        yield Gen(p, z.sp_output_len, ignore_eos=True)

    return Workload(
        "shared-prefix",
        f"{z.sp_groups} groups x {z.sp_per_group} requests, {z.sp_system_len}-token shared system "
        f"prompt + {z.sp_question_len}-token question, {z.sp_output_len} tokens out (ignore_eos), all at once",
        {k: getattr(z, k) for k in ("sp_groups", "sp_per_group", "sp_system_len", "sp_question_len", "sp_output_len")},
        lambda: [one(p) for p in prompts],
        len(prompts),
        z.sp_system_len + z.sp_question_len + 16,
        z.sp_output_len,
    )


# ---- 2 agent-loop ---------------------------------------------------------------------------------------

TOOLS = ("search", "calculator", "lookup", "final_answer")
TOOL_SCHEMA = {
    "type": "object",
    "properties": {"tool": {"type": "string", "enum": list(TOOLS)}, "input": {"type": "string", "maxLength": 24}},
    "required": ["tool", "input"],
    "additionalProperties": False,
}
AGENT_HEAD = (
    "You are an agent that solves a task step by step with tools. Every turn, reply with exactly one JSON object "
    '{"tool": NAME, "input": TEXT} and nothing else. Tools:\n'
    "- search: searches the web; input is a short query\n"
    "- calculator: evaluates arithmetic; input is an expression such as 12*7+3\n"
    "- lookup: returns an encyclopedia entry; input is a title\n"
    "- final_answer: ends the task; input is the answer\n"
    "After each call you get an Observation. Notes:"
)
CITIES = ("Paris", "Lima", "Oslo", "Cairo", "Osaka", "Quito", "Perth", "Dakar", "Hanoi", "Porto", "Minsk", "Accra")
TASKS = (
    "What is the population of {c} divided by {n}?",
    "How far is {c} from the sea, in miles, times {n}?",
    "Find the founding year of {c} and add {n} to it.",
    "Which river flows through {c}? Count its letters, times {n}.",
)


def agent_loop(words: Words, z: Sizes) -> Workload:
    rng = random.Random(f"{z.seed}-agent-loop")
    system = AGENT_HEAD + words.text(rng, z.agent_system_len)
    tasks, observations = [], []
    for _ in range(z.agent_programs):
        t = rng.choice(TASKS).format(c=rng.choice(CITIES), n=rng.randrange(2, 99))
        tasks.append(t + " Context:" + words.text(rng, z.agent_task_len))
        observations.append(["Observation:" + words.text(rng, z.agent_obs_len) for _ in range(z.agent_steps)])

    def program(i: int) -> Program:
        call = Gen(
            chatml([("system", system), ("user", tasks[i])]),
            z.agent_max_tokens,
            json_schema=TOOL_SCHEMA,
            validate_schema=TOOL_SCHEMA,
        )
        for k in range(z.agent_steps):
            rec = yield call
            # the next prompt = this prompt + the answer + a tool observation (scripted: the same work everywhere)
            suffix = "<|im_end|>\n" + chatml([("user", observations[i][k])])
            call = dataclasses.replace(call, prompt=call.prompt + rec.output_text + suffix, cont=(rec, suffix))

    per_call = z.agent_obs_len + z.agent_max_tokens + 16
    return Workload(
        "agent-loop",
        f"{z.agent_programs} agents x {z.agent_steps} dependent JSON tool calls (<= "
        f"{z.agent_max_tokens} tokens), {z.agent_obs_len}-token observations, ~{z.agent_system_len + 120}-token "
        "shared system prompt",
        {
            k: getattr(z, k)
            for k in (
                "agent_programs",
                "agent_steps",
                "agent_system_len",
                "agent_task_len",
                "agent_obs_len",
                "agent_max_tokens",
            )
        },
        lambda: [program(i) for i in range(z.agent_programs)],
        z.agent_programs * z.agent_steps,
        z.agent_system_len + 160 + z.agent_task_len + z.agent_steps * per_call,
        z.agent_max_tokens,
    )


# ---- 3 multi-turn-chat ----------------------------------------------------------------------------------

CHAT_SYSTEM = "You are a helpful assistant. Answer briefly."
OPENERS = ("Tell me more about", "Can you explain", "What do you think of", "Summarize", "Give an example of")


def multi_turn_chat(words: Words, z: Sizes) -> Workload:
    rng = random.Random(f"{z.seed}-multi-turn-chat")
    turns = [
        [rng.choice(OPENERS) + words.text(rng, z.chat_user_len) + "?" for _ in range(z.chat_turns)]
        for _ in range(z.chat_convs)
    ]

    def program(i: int) -> Program:
        call = Gen(chatml([("system", CHAT_SYSTEM), ("user", turns[i][0])]), z.chat_reply_len, ignore_eos=True)
        for t in range(z.chat_turns):
            rec = yield call
            if t + 1 < z.chat_turns:
                suffix = "<|im_end|>\n" + chatml([("user", turns[i][t + 1])])
                call = dataclasses.replace(call, prompt=call.prompt + rec.output_text + suffix, cont=(rec, suffix))

    return Workload(
        "multi-turn-chat",
        f"{z.chat_convs} conversations x {z.chat_turns} turns, {z.chat_user_len}-token user "
        f"turns, {z.chat_reply_len}-token replies (ignore_eos)",
        {k: getattr(z, k) for k in ("chat_convs", "chat_turns", "chat_user_len", "chat_reply_len")},
        lambda: [program(i) for i in range(z.chat_convs)],
        z.chat_convs * z.chat_turns,
        24 + z.chat_turns * (z.chat_user_len + 2 * z.chat_reply_len + 16),
        z.chat_reply_len,
    )


# ---- 4 few-shot-select ----------------------------------------------------------------------------------

LABELS = ("positive", "negative", "neutral", "mixed")
CHOICES = [" " + x for x in LABELS]
_POS = ("wonderful", "excellent", "great", "delightful", "superb", "lovely", "fantastic", "pleasant")
_NEG = ("terrible", "awful", "poor", "disappointing", "flimsy", "horrible", "bad", "useless")
_NEU = ("ordinary", "average", "standard", "typical", "plain", "acceptable")
_PRODUCTS = ("blender", "laptop", "jacket", "kettle", "camera", "backpack", "lamp", "headset", "chair", "watch")
_ASPECTS = ("battery", "price", "design", "delivery", "screen", "fabric", "handle", "sound", "manual", "box")


def _review(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(LABELS)
    p, a1, a2 = rng.choice(_PRODUCTS), rng.choice(_ASPECTS), rng.choice(_ASPECTS)
    if label == "mixed":
        x, y = rng.choice(_POS), rng.choice(_NEG)
        if rng.random() < 0.5:
            x, y = y, x
        return f"The {p} is {x}, but the {a1} is {y}.", label
    pool = {"positive": _POS, "negative": _NEG, "neutral": _NEU}[label]
    return f"The {p} is {rng.choice(pool)} and the {a2} is {rng.choice(pool)}.", label


def few_shot_select(words: Words, z: Sizes) -> Workload:
    rng = random.Random(f"{z.seed}-few-shot-select")
    prefix = "Classify the sentiment of each product review as positive, negative, neutral or mixed.\n\n"
    for _ in range(z.select_examples):
        r, lab = _review(rng)
        prefix += f"Review: {r}\nSentiment: {lab}\n\n"
    inputs = [_review(rng) for _ in range(z.select_inputs)]

    def program(i: int) -> Program:
        r, lab = inputs[i]
        yield Select(prefix + f"Review: {r}\nSentiment:", list(CHOICES), label=" " + lab)

    return Workload(
        "few-shot-select",
        f"{z.select_examples}-example few-shot prefix, then select over {len(CHOICES)} labels "
        f"for {z.select_inputs} reviews",
        {k: getattr(z, k) for k in ("select_examples", "select_inputs")},
        lambda: [program(i) for i in range(z.select_inputs)],
        z.select_inputs,
        40 + (z.select_examples + 1) * 24,
        4,
    )


# ---- 5 json-decode --------------------------------------------------------------------------------------

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "occupation": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city", "occupation"],
    "additionalProperties": False,
}
JSON_SYSTEM = (
    "Extract the person described by the user as one JSON object with the keys name, age, city and "
    "occupation, following this schema: " + json.dumps(PERSON_SCHEMA) + ". Reply with the JSON only."
)
_FIRST = ("Anna", "Ravi", "Lena", "Tomas", "Mei", "Omar", "Sofia", "Jonas", "Aiko", "Pedro", "Nadia", "Eli")
_LAST = ("Berg", "Okafor", "Silva", "Novak", "Tanaka", "Haddad", "Rossi", "Meyer", "Kim", "Costa")
_JOBS = ("nurse", "carpenter", "engineer", "teacher", "baker", "pilot", "chemist", "librarian", "farmer", "lawyer")


def json_decode(words: Words, z: Sizes, constrained: bool = True) -> Workload:
    rng = random.Random(f"{z.seed}-json-decode")  # the same prompts with and without the constraint
    prompts = []
    for _ in range(z.json_requests):
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        text = (
            f"{name} is a {rng.randrange(19, 80)}-year-old {rng.choice(_JOBS)} who lives in "
            f"{rng.choice(CITIES)}.{words.text(rng, z.json_filler_len)}."
        )
        prompts.append(chatml([("system", JSON_SYSTEM), ("user", text)]))

    def one(p: str, n: Optional[int]) -> Program:
        if constrained:
            yield Gen(p, z.json_max_tokens, json_schema=PERSON_SCHEMA, validate_schema=PERSON_SCHEMA)
        elif n is None:
            yield Gen(p, z.json_max_tokens, validate_schema=PERSON_SCHEMA)
        else:  # exactly as many tokens as the constrained call made: the same work, less the grammar
            yield Gen(p, max(n, 1), ignore_eos=True, validate_schema=PERSON_SCHEMA)

    def make(lengths: Optional[dict] = None) -> list[Program]:
        return [one(p, (lengths or {}).get(i)) for i, p in enumerate(prompts)]

    if constrained:
        name, how = "json-decode", "constrained by PERSON_SCHEMA"
    else:
        name, how = "json-decode-free", "the same prompts unconstrained, as many tokens as constrained (ignore_eos)"
    return Workload(
        name,
        f"{z.json_requests} person-record extractions, <= {z.json_max_tokens} tokens, {how}",
        {k: getattr(z, k) for k in ("json_requests", "json_filler_len", "json_max_tokens")},
        make,
        len(prompts),
        200 + z.json_filler_len + 40,
        z.json_max_tokens,
        headline="output_throughput",
        match_from=None if constrained else "json-decode",
    )


WORKLOADS = ("shared-prefix", "agent-loop", "multi-turn-chat", "few-shot-select", "json-decode")


def build(names: list[str], words: Words, z: Sizes) -> list[Workload]:
    """The workloads named (``json-decode`` brings its unconstrained twin ``json-decode-free``)."""
    out = []
    for n in names:
        if n == "shared-prefix":
            out.append(shared_prefix(words, z))
        elif n == "agent-loop":
            out.append(agent_loop(words, z))
        elif n == "multi-turn-chat":
            out.append(multi_turn_chat(words, z))
        elif n == "few-shot-select":
            out.append(few_shot_select(words, z))
        elif n == "json-decode":
            out += [json_decode(words, z, True), json_decode(words, z, False)]
        else:
            raise ValueError(f"unknown workload {n!r}; known: {WORKLOADS}")
    return out
