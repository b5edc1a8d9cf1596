"""What the model's text means, per family: its own chat template (``chat_template``, tools included),
tool-call formats (``tool_formats``: hermes, qwen25, llama3, mistral; ``tool_styles``: the tool plan's
tagged/array/object styles), the one streaming tool-call parser (``tool_stream``), reasoning sections
(``reasoning``), choices (``choice``) and the JSON scanning they share (``json_scan``). May import
constrained only.
"""

from radixrt.runtime.parsers.reasoning import ReasoningFormat, ReasoningStream, get_reasoning_format
from radixrt.runtime.parsers.tool_formats import ToolFormat, detect_tool_format, get_tool_format
from radixrt.runtime.parsers.tool_stream import ToolCallStream, parse_tool_output

__all__ = [
    "ReasoningFormat",
    "ReasoningStream",
    "ToolCallStream",
    "ToolFormat",
    "detect_tool_format",
    "get_reasoning_format",
    "get_tool_format",
    "parse_tool_output",
]
