"""Role rendering for ``system/user/assistant``.

The template is derived from the model's own Hugging Face chat template (the Jinja template in the
tokenizer): messages with sentinel contents are rendered and split around the sentinels, which gives each
role's prefix and suffix and the default system prompt the template inserts when the first message is not
a system message. So ``s.text()`` equals ``tokenizer.apply_chat_template(s.messages())`` for complete
conversations, and the DSL's prompts hit the same radix-cache entries as the OpenAI chat API.

Where no tokenizer is available (an OpenAI-compatible server, or a server whose tokenizer cannot be
loaded offline) the ChatML template is used: ``<|im_start|>role\\ncontent<|im_end|>\\n``, which is
SmolLM2's format, without a default system prompt.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
_SENT = ("Xq7SENTINELaZ", "Xq7SENTINELbZ", "Xq7SENTINELcZ")


@dataclass
class ChatTemplate:
    """Role prefixes/suffixes plus the default system prompt (None: no system message is inserted)."""

    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    default_system_prompt: Optional[str] = None
    stop_str: tuple[str, ...] = field(default_factory=tuple)

    def get_prefix_and_suffix(self, role: str, hist_messages: list[dict]) -> tuple[str, str]:
        """The text before and after a ``role`` message's content.

        Raises:
            ValueError: a role the template does not know.
        """
        try:
            return self.role_prefix_and_suffix[role]
        except KeyError:
            raise ValueError(f"unknown role {role!r}; known: {sorted(self.role_prefix_and_suffix)}") from None


CHATML = ChatTemplate(
    name="chatml",
    role_prefix_and_suffix={r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ROLES},
    default_system_prompt=None,
)


def _render(tokenizer: Any, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)


def _split(text: str, sentinel: str) -> tuple[str, str]:
    i = text.index(sentinel)
    return text[:i], text[i + len(sentinel) :]


def from_tokenizer(tokenizer: Any) -> ChatTemplate:
    """Derive a :class:`ChatTemplate` from ``tokenizer.chat_template``; ChatML when that fails.

    Never raises: a template that cannot be split per role (one whose rendering of a message depends on
    later messages) falls back to ChatML with a warning.
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return CHATML
    a, b, c = _SENT
    try:
        msgs = [{"role": "system", "content": a}, {"role": "user", "content": b}, {"role": "assistant", "content": c}]
        t1, t2, t3 = (_render(tokenizer, msgs[:n]) for n in (1, 2, 3))
        if not (t2.startswith(t1) and t3.startswith(t2)):
            raise ValueError("renderings are not incremental")
        rps = {"system": _split(t1, a), "user": _split(t2[len(t1) :], b), "assistant": _split(t3[len(t2) :], c)}
        gen_prompt = tokenizer.apply_chat_template(msgs[1:2], tokenize=False, add_generation_prompt=True)
        only_user = _render(tokenizer, msgs[1:2])
        if not gen_prompt.endswith(rps["assistant"][0]) or not gen_prompt.startswith(only_user):
            raise ValueError("the generation prompt differs from the assistant prefix")
        default = None
        head = only_user[: only_user.index(rps["user"][0] + b)]
        if head:  # the template inserts a system message of its own
            pre, suf = rps["system"]
            if not (head.startswith(pre) and head.endswith(suf)):
                raise ValueError(f"cannot parse the default system message {head!r}")
            default = head[len(pre) : len(head) - len(suf)]
        name = getattr(tokenizer, "name_or_path", "") or "hf"
        return ChatTemplate(name=f"hf:{name}", role_prefix_and_suffix=rps, default_system_prompt=default)
    except Exception as e:  # noqa: BLE001 - any template oddity means: use the documented fallback
        logger.warning("chat template not usable per role (%s); falling back to ChatML", e)
        return CHATML
