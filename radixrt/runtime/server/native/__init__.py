"""SGLang's native API: ``/generate`` and the health, info, flush and abort routes (``routes``), the
``/generate`` body (``body``), sessions (``session_routes``), and the DSL's ZMQ socket, which speaks the
same bodies (``dsl_socket``). May import manager, observe, context, api_models and http of the server.
"""
