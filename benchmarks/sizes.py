"""Every workload size, each a ``run_all.py`` flag (``--sp-groups`` ...), and the presets (``default``, ``tiny``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class Sizes:
    seed: int = 0
    # 1 shared-prefix (SGLang's gsp defaults 64 x 16 x 2048 / 128 / 256, scaled to 2 CPU cores; the ratio
    # system : question and 16 requests a group are kept, so prefix reuse dominates as there)
    sp_groups: int = 2
    sp_per_group: int = 16
    sp_system_len: int = 512
    sp_question_len: int = 32
    sp_output_len: int = 16
    # 2 agent-loop
    agent_programs: int = 8
    agent_steps: int = 4
    agent_system_len: int = 256
    agent_task_len: int = 24
    agent_obs_len: int = 32
    agent_max_tokens: int = 64
    # 3 multi-turn-chat
    chat_convs: int = 8
    chat_turns: int = 4
    chat_user_len: int = 48
    chat_reply_len: int = 24
    # 4 few-shot-select
    select_examples: int = 16
    select_inputs: int = 16
    # 5 json-decode
    json_requests: int = 16
    json_filler_len: int = 48
    json_max_tokens: int = 128
    # 6 agent-dependent, 7 shared-system-16 (target_workloads.py, issue 12's llama.cpp targets)
    dep_steps: int = 4
    dep_tools_words: int = 700
    dep_output_len: int = 32
    dep_obs_len: int = 32
    dep_agents: int = 1  # agents running at once, each its own task on the shared tool list
    ss_groups: int = 4
    ss_per_group: int = 8
    ss_system_words: int = 700
    ss_question_len: int = 32
    ss_output_len: int = 16
    ss_concurrency: int = 16


TINY = dict(
    sp_groups=2,
    sp_per_group=2,
    sp_system_len=48,
    sp_question_len=8,
    sp_output_len=4,
    agent_programs=2,
    agent_steps=2,
    agent_system_len=32,
    agent_task_len=8,
    agent_obs_len=8,
    agent_max_tokens=40,
    chat_convs=1,
    chat_turns=4,
    chat_user_len=8,
    chat_reply_len=4,
    select_examples=3,
    select_inputs=2,
    json_requests=2,
    json_filler_len=8,
    json_max_tokens=128,
    dep_steps=2,
    dep_tools_words=40,
    dep_output_len=4,
    dep_obs_len=8,
    ss_groups=2,
    ss_per_group=2,
    ss_system_words=40,
    ss_question_len=8,
    ss_output_len=4,
    ss_concurrency=2,
)

PRESETS = {"default": {}, "tiny": TINY}


def sizes_from(preset: str, overrides: dict) -> Sizes:
    z = Sizes(**PRESETS[preset])
    return dataclasses.replace(z, **{k: v for k, v in overrides.items() if v is not None})


SIZE_FIELDS = [f.name for f in dataclasses.fields(Sizes)]
