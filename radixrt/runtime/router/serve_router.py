"""A custom Ray Serve request router that asks a :mod:`radixrt.runtime.router.policy` class where to go.

Ray Serve (>= 2.4x, ``ray.serve.request_router``, an alpha API) lets a deployment name its own
``RequestRouter`` subclass in ``RequestRouterConfig``; the router lives inside every caller's deployment
handle (here: the ingress) and, per request, returns ranked lists of candidate replicas. Ours:

- reads the request's token ids and session key from the first positional argument (a dict built by the
  ingress: ``{"tokens": [...], "session": ..., ...}``);
- counts the requests it has in flight per replica itself (``on_send_request`` / ``on_request_completed``)
  and gives those loads to the policy, which picks one replica;
- ranks the pick first and every other replica after it, so that Ray falls back to another replica when
  the pick is full (``max_ongoing_requests``) instead of waiting;
- keeps one policy object per policy name; the request's ``"policy"`` (set by the ingress, which can swap
  it at run time for A/B runs) picks one, ``request_router_kwargs["policy"]`` is the default;
- drops a dead replica from every policy (its tree and its sticky sessions).

Ray Serve imports this class by path but may rebuild it by value (cloudpickle), so module-level state here
is not shared with the ingress: everything the ingress needs travels in the request instead.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import List, Optional

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from radixrt.runtime.router.policy import make_policy

logger = logging.getLogger("radixrt.router")


class PolicyRequestRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, policy: str = "cache_aware", **policy_kwargs) -> None:
        """Called by Ray Serve with ``request_router_kwargs``. Raises ValueError on an unknown policy."""
        self.default = policy
        self.policies = {policy: make_policy(policy, **policy_kwargs)}
        self.in_flight: dict[str, int] = defaultdict(int)

    async def choose_replicas(
        self, candidate_replicas: List[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        req = pending_request.args[0] if pending_request is not None and pending_request.args else None
        if not isinstance(req, dict):
            return [candidate_replicas]
        name = req.get("policy") or self.default
        policy = self.policies.get(name)
        if policy is None:  # validated by the ingress
            policy = self.policies[name] = make_policy(name)
        loads = {rid: self.in_flight[rid] for rid in by_id}
        pick = policy.select(req.get("tokens") or [], loads, req.get("session"))
        return [[by_id[pick]], [r for rid, r in by_id.items() if rid != pick]]

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        self.in_flight[replica_id.unique_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        n = self.in_flight[replica_id.unique_id]
        self.in_flight[replica_id.unique_id] = max(n - 1, 0)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        logger.warning("replica %s died; routing around it", replica_id.unique_id)
        for policy in self.policies.values():
            policy.remove(replica_id.unique_id)
        self.in_flight.pop(replica_id.unique_id, None)
