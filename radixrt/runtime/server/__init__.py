"""``radixrt serve``: the multi-process server, by API (see :mod:`.launch`).

- ``launch``: the CLI and process lifecycle; ``http_server``: the FastAPI app over one router per family;
  ``context``: what every route needs; ``api_models``: every route's documented models (``/openapi.json``).
- ``openai/``: OpenAI's chat, completions and models routes, their protocol, sampling mapping, tool calling
  and chat formats (the scope of docs/compatibility.md).
- ``native/``: SGLang's native API (``/generate``, health, info, flush, sessions) and the DSL's ZMQ socket.
- ``manager/``: the main process's own runtime: the TokenizerManager, the ZMQ sockets to the children, the
  child processes, one call's requests.
- ``observe/``: Prometheus metrics, latency windows, the dashboard; ``cli/``: ``radixrt profile``;
  ``http/``: errors, request bodies and responses shared by every route.

The top layer: nothing else in radixrt imports it. Its own layers: launch > http_server > cli > openai |
native > manager > observe > api_models | context | http.
"""
