"""What the server shows about itself: Prometheus metrics (``metrics``), recent TTFT/ITL windows
(``latency``) and the live dashboard with its ``/cache_tree`` JSON (``dashboard``). May import context and
http.
"""
