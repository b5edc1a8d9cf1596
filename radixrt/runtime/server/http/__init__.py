"""What every route shares: OpenAI-style error bodies and handlers (``errors``), reading a JSON body
(``body``) and msgspec JSON / server-sent-event responses (``responses``). The server's bottom layer.
"""
