"""The structural-tag spellings every backend accepts, normalized to xgrammar's form.

Accepted: xgrammar's ``{"type": "structural_tag", "format": {...}}``; a bare format object
(``{"type": "triggered_tags", ...}``); SGLang's legacy ``{"structures": [{"begin", "schema", "end"}],
"triggers": [...]}``.
"""

from __future__ import annotations

import json


def normalize_structural_tag(text: str) -> str:
    """The accepted structural-tag spellings (see the module doc) as ``{"type":"structural_tag","format":...}``.

    Raises:
        ValueError: the legacy form without lists, or an object without ``type``.
    """
    obj = json.loads(text)
    if "structures" in obj or ("triggers" in obj and "type" not in obj):
        structures = obj.get("structures")
        triggers = obj.get("triggers")
        if not isinstance(structures, list) or not isinstance(triggers, list):
            raise ValueError("legacy form needs 'structures' (list) and 'triggers' (list)")
        tags = []
        for i, st in enumerate(structures):
            if not isinstance(st, dict) or not {"begin", "schema", "end"} <= st.keys():
                raise ValueError(f"structures[{i}] needs 'begin', 'schema' and 'end'")
            tags.append(
                {
                    "type": "tag",
                    "begin": st["begin"],
                    "end": st["end"],
                    "content": {"type": "json_schema", "json_schema": st["schema"]},
                }
            )
        obj = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}
    elif obj.get("type") != "structural_tag":
        if "type" not in obj:
            raise ValueError("missing 'type' (expected \"structural_tag\" with a 'format')")
        obj = {"type": "structural_tag", "format": obj}
    return json.dumps(obj, ensure_ascii=False)
