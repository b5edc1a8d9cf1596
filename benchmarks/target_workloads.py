"""The two workloads behind issue 12's llama.cpp targets (``--workloads all`` or by name; ``make bench`` runs them).

6. ``agent-dependent``  ``dep_agents`` (1) agents, each making ``dep_steps`` (4) dependent calls, one after
                        another, on a shared system prompt holding a ``dep_tools_words`` (700) word tool list,
                        each with its own task; each call generates exactly ``dep_output_len`` (32) tokens
                        (ignore_eos), then a ``dep_obs_len`` (32) token tool observation is appended. The
                        latency users of an agent feel; target >= 1.2x llama-server's req/s. The agents run at
                        once (llama-server gets ``dep_agents`` slots).
7. ``shared-system-16`` ``ss_groups`` (4) system prompts of ``ss_system_words`` (700) words, each shared by
                        ``ss_per_group`` (8) requests (32 in all) with their own ``ss_question_len`` (32) token
                        question, ``ss_output_len`` (16) tokens out (ignore_eos), at most ``ss_concurrency`` (16)
                        in flight (llama-server gets 16 slots); target >= 3x llama-server's req/s.

Words are single-token words (``workloads.Words``), so a 700-word list is about 700 tokens.
"""

from __future__ import annotations

import dataclasses
import random

from sizes import Sizes
from workloads import AGENT_HEAD, Gen, Program, Words, Workload, chatml


def _tool_list(words: Words, rng: random.Random, n_words: int) -> str:
    """``n_words`` words of tool descriptions, 20 words a tool: ``- tool_7: <words>`` lines."""
    lines, left, i = [], n_words, 0
    while left > 0:
        k = min(20, left)
        lines.append(f"- tool_{i}:" + words.text(rng, k))
        left, i = left - k, i + 1
    return "\n".join(lines)


def agent_dependent(words: Words, z: Sizes) -> Workload:
    rng = random.Random(f"{z.seed}-agent-dependent")
    system = AGENT_HEAD.split(" Tools:")[0] + " Tools:\n" + _tool_list(words, rng, z.dep_tools_words)
    # agent 0 keeps the task and observations the 1-agent workload always had
    tasks = ["Plan a trip to Oslo within a budget of 900 dollars. Context:" + words.text(rng, 24)]
    observations = [["Observation:" + words.text(rng, z.dep_obs_len) for _ in range(z.dep_steps)]]
    for i in range(1, z.dep_agents):
        tasks.append(f"Task {i}: plan a trip within a budget. Context:" + words.text(rng, 24))
        observations.append(["Observation:" + words.text(rng, z.dep_obs_len) for _ in range(z.dep_steps)])

    def program(i: int) -> Program:
        call = Gen(chatml([("system", system), ("user", tasks[i])]), z.dep_output_len, ignore_eos=True)
        for k in range(z.dep_steps):
            rec = yield call
            if k + 1 < z.dep_steps:
                suffix = "<|im_end|>\n" + chatml([("user", observations[i][k])])
                call = dataclasses.replace(call, prompt=call.prompt + rec.output_text + suffix, cont=(rec, suffix))

    tokens = 2 * z.dep_tools_words + 80 + z.dep_steps * (z.dep_obs_len + z.dep_output_len + 16)
    who = "1 agent" if z.dep_agents == 1 else f"{z.dep_agents} agents at once, each"
    return Workload(
        "agent-dependent",
        f"{who} x {z.dep_steps} dependent calls on a {z.dep_tools_words}-word tool list, "
        f"{z.dep_output_len} tokens out each (ignore_eos), {z.dep_obs_len}-token observations",
        {k: getattr(z, k) for k in ("dep_agents", "dep_steps", "dep_tools_words", "dep_output_len", "dep_obs_len")},
        lambda: [program(i) for i in range(z.dep_agents)],
        z.dep_agents * z.dep_steps,
        tokens,
        z.dep_output_len,
        concurrency=z.dep_agents,
    )


def shared_system_16(words: Words, z: Sizes) -> Workload:
    rng = random.Random(f"{z.seed}-shared-system-16")
    systems = [words.text(rng, z.ss_system_words) for _ in range(z.ss_groups)]
    prompts = [
        chatml([("system", systems[g]), ("user", "Question:" + words.text(rng, z.ss_question_len))])
        for g in range(z.ss_groups)
        for _ in range(z.ss_per_group)
    ]
    rng.shuffle(prompts)

    def one(p: str) -> Program:
        yield Gen(p, z.ss_output_len, ignore_eos=True)

    n = z.ss_groups * z.ss_per_group
    return Workload(
        "shared-system-16",
        f"{n} requests, {z.ss_groups} shared {z.ss_system_words}-word system prompts + "
        f"{z.ss_question_len}-token questions, {z.ss_output_len} tokens out (ignore_eos), "
        f"{z.ss_concurrency} concurrent",
        {
            k: getattr(z, k)
            for k in (
                "ss_groups",
                "ss_per_group",
                "ss_system_words",
                "ss_question_len",
                "ss_output_len",
                "ss_concurrency",
            )
        },
        lambda: [one(p) for p in prompts],
        n,
        2 * z.ss_system_words + z.ss_question_len + 24,
        z.ss_output_len,
        concurrency=z.ss_concurrency,
    )


TARGET_WORKLOADS = {"agent-dependent": agent_dependent, "shared-system-16": shared_system_16}
