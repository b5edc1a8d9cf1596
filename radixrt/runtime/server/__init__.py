"""``radixrt serve``: the multi-process server (see :mod:`.launch`).

- :mod:`.launch`: the CLI and process lifecycle;
- :mod:`.tokenizer_manager`: validation, tokenization and the ZMQ plumbing of the main process;
- :mod:`.http`: the FastAPI app (OpenAI-compatible and SGLang-native routes);
- :mod:`.openai_protocol`: OpenAI request models and response building;
- :mod:`.dsl_socket`: the DSL's ZMQ ROUTER;
- :mod:`.metrics`: Prometheus metrics.
"""
