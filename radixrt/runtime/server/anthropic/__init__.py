"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) over the chat path of
:mod:`radixrt.runtime.server.openai`: protocol (request -> chat messages, response blocks), serving
(routes, the streamed events). Errors on these routes are in Anthropic's shape (``http/errors.py``)."""
