"""``radixrt serve --dp N``: N radixrt replicas behind a cache-aware router, on Ray Serve.

    radixrt serve --dp 2                                 # a local Ray (num_cpus=2, no dashboard)
    radixrt serve --dp 8 --ray-address auto              # an existing cluster (ray start --head ...)
    radixrt serve --dp 4 --router-policy round_robin     # a baseline

Ray is the optional extra ``[cluster]`` (``pip install 'radixrt[cluster]'``). The HTTP API (OpenAI +
``/generate``) is Ray Serve's proxy on ``--host``/``--port``; ``GET /router/stats`` gives each replica's
cache hit rate. The ready line has the single-server shape:
``radixrt ready: http://127.0.0.1:30000 (dp=2 router=cache_aware) model=...``.
Ctrl-C / SIGTERM shut Serve down (each replica stops its server) and stop the local Ray.
"""

from __future__ import annotations

import signal
import sys
import threading

from radixrt.runtime.config import ServerArgs

# flags a replica's own server must not inherit: the cluster's, and the public endpoint's
_NOT_FOR_REPLICA = ("dp", "router_policy", "ray_address", "host", "port", "zmq_port", "api_key")


def build_app(args: ServerArgs):
    """The Serve application: the ingress bound to ``args.dp`` replicas with our request router."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from radixrt.runtime.router.ingress import RouterIngress
    from radixrt.runtime.router.replica import DRAIN_MARGIN_S, RadixrtReplica
    from radixrt.runtime.router.serve_router import PolicyRequestRouter

    replica = serve.deployment(RadixrtReplica).options(
        name="radixrt_replica",
        num_replicas=args.dp,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=args.max_running_requests,
        health_check_period_s=5,
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=args.drain_timeout + DRAIN_MARGIN_S,  # the replica drains its server
        request_router_config=RequestRouterConfig(
            request_router_class=PolicyRequestRouter, request_router_kwargs={"policy": args.router_policy}
        ),
    )
    ingress = serve.deployment(RouterIngress).options(
        name="radixrt_ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10000
    )
    return ingress.bind(
        replica.bind(args.to_cli(skip=_NOT_FOR_REPLICA), args.drain_timeout),
        args.model,
        args.api_key,
        args.router_policy,
    )


def serve_dp(args: ServerArgs) -> int:
    """Run until Ctrl-C / SIGTERM. Returns the exit status (2 when Ray is not installed)."""
    try:
        import ray
        from ray import serve
    except ImportError:
        print("radixrt: error: --dp needs Ray Serve: pip install 'radixrt[cluster]'", file=sys.stderr)
        return 2
    from radixrt.runtime.models.loader import resolve_model

    name = resolve_model(args.model).name
    if args.ray_address:
        ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(args), name="radixrt", route_prefix="/", blocking=False)
        host = args.host if ":" not in args.host else f"[{args.host}]"
        print(
            f"radixrt ready: http://{host}:{args.port} (dp={args.dp} router={args.router_policy}) model={name}",
            flush=True,
        )
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
