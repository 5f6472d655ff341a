"""The Ray Serve request router of the engine replicas: least-loaded, with prefix-cache affinity.

Ray Serve calls :meth:`PrefixAwareRouter.choose_replicas` in the caller's process (the OpenAI front) for each
request; it returns ranks of replicas, and Serve sends the request to the replica of the first rank with the
shortest queue that has room (``max_ongoing_requests``), probing queue lengths it has not cached. So:

- a request whose leading prompt blocks were routed to a replica before goes to that replica (rank 1), unless its
  queue is longer than the shortest one by more than ``imbalance``: then reusing the cache would cost more
  waiting than it saves;
- any other request goes to the least-loaded replica (one rank of all; ties broken at random);
- a front's output channel (``EngineReplica.outputs``) goes to the replica it names.
"""

from __future__ import annotations

import random

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from minivllm.scale_out.serve.prefix_index import PrefixIndex, block_hashes
from minivllm.scale_out.serve.replica import Channel, ReplicaRequest


def _request_of(pending: PendingRequest | None) -> ReplicaRequest | None:
    if pending is None:
        return None
    return next((a for a in pending.args if isinstance(a, ReplicaRequest)), None)


class PrefixAwareRouter(FIFOMixin, RequestRouter):
    """Least-loaded routing that keeps requests sharing a prompt prefix on the replica that has it cached."""

    def initialize_state(self, block_size: int = 16, imbalance: int = 8, capacity: int = 100_000,
                         seed: int | None = None) -> None:
        """``block_size``: the engines' ``kvcache_block_size``; ``imbalance``: how many more requests in flight a
        replica may have than the least-loaded one and still get a request for its cached prefix."""
        self.index = PrefixIndex(block_size, capacity)
        self.imbalance = imbalance
        self._rng = random.Random(seed)

    def _load(self, replica: RunningReplica) -> int:
        n = self.replica_queue_len_cache.get(replica.replica_id)
        return 0 if n is None else n

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Ranks of replicas for one request: its prefix's replica first when the load allows, else all."""
        candidates = list(candidate_replicas)
        channel = next((a for a in pending_request.args if isinstance(a, Channel)), None) if pending_request else None
        if channel is not None:  # a front's channel goes to its replica, or waits until the front gives up
            return [[r for r in candidates if r.replica_id.unique_id == channel.replica_id]]
        self._rng.shuffle(candidates)
        request = _request_of(pending_request)
        if request is None or not isinstance(request.prompt, list) or len(candidates) < 2:
            return [candidates]
        hashes = block_hashes(request.prompt, self.index.block_size)
        by_id = {r.replica_id: r for r in candidates}
        best, blocks = self.index.best(by_id, hashes)
        if best is None:
            return [candidates]
        least = min(self._load(r) for r in candidates)
        if self._load(by_id[best]) > least + self.imbalance:
            return [candidates]
        return [[by_id[best]], [r for r in candidates if r.replica_id != best]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        """The replica now caches the request's prompt blocks."""
        request = _request_of(pending_request)
        if request is not None and isinstance(request.prompt, list):
            self.index.insert(replica_id, block_hashes(request.prompt, self.index.block_size))

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve's new replica set: forget the replicas that left it (scaled down or replaced)."""
        super().update_replicas(replicas)
        self.index.retain({r.replica_id for r in replicas})

    def on_replica_actor_died(self, replica_id) -> None:
        """A dead replica's cache is gone with it."""
        super().on_replica_actor_died(replica_id)
        self.index.remove(replica_id)
