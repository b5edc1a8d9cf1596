"""``radixrt serve``: the multi-process server (see :mod:`.launch`).

- :mod:`.launch`: the CLI and process lifecycle; :mod:`.child_processes`: the scheduler and detokenizer
  processes; :mod:`.ipc`: the ZMQ sockets to them;
- :mod:`.tokenizer_manager`: validation, tokenization and fan-out of results (:mod:`.req_batch`);
  :mod:`.native_body`: the /generate body;
- :mod:`.http_server`: the FastAPI app, assembled from :mod:`.native`, :mod:`.model_routes`, :mod:`.chat`
  and :mod:`.completions` (which share :mod:`.openai_serving`), with :mod:`.http_errors`,
  :mod:`.responses` and :mod:`.request_body`;
- :mod:`.openai_protocol`: OpenAI request models and response building; :mod:`.openai_sampling`: an
  OpenAI request as sampling params; :mod:`.tool_parser` / :mod:`.tool_scan`: tool calling;
- :mod:`.dsl_socket`: the DSL's ZMQ ROUTER;
- :mod:`.metrics`: Prometheus metrics.
"""
