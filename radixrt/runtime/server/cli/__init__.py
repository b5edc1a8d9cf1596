"""Command-line extras of ``radixrt``: ``radixrt profile`` (``profile_cmd``) and the OpenAI chat files it
reads (``chat_log``). May import the routes' packages (openai) below it.
"""
