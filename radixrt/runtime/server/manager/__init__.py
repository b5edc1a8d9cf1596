"""The main process's runtime, apart from the routes: the TokenizerManager (validate, tokenize, send to
the scheduler, fan results out), the ZMQ sockets to the children (``ipc``), the child processes
(``child_processes``), their restart when one dies (``supervisor``), the bound on requests in flight and
the SIGTERM drain (``admission``), and one client call's requests (``req_batch``). May import observe and http.
"""
