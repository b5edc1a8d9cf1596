"""OpenAI-compatible routes: ``/v1/chat/completions`` (``chat``, with tool calling: ``tool_parser``,
``chat_format``), ``/v1/completions`` (``completions``) and ``/v1/models`` (``model_routes``); their
request models and response building (``protocol``), the mapping to sampling parameters (``sampling``)
and the one response path, streamed or not (``serving``). Exactly the scope of docs/compatibility.md.
May import manager, observe, context, api_models and http of the server.
"""
