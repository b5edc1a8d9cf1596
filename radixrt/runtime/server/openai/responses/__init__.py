"""OpenAI's Responses API (``/v1/responses``) over the chat path: protocol (request -> chat messages),
items (input and output items and their ids), store (stored responses, each pinning its conversation as a
session), events (typed SSE), routes."""
