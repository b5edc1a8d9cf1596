"""OpenAI's Responses API (``/v1/responses``) over the chat path: protocol (request -> chat messages),
store (stored responses, each pinning its conversation as a session), events (typed SSE), routes."""
