"""Fake minivllm engines for the scale-out simulation: a step-cost model, one replica's token-budget scheduler,
and N replicas behind a router, driven event by event (no GPU, no torch).

A replica runs steps back to back while it has work. Each step is planned the way ``minivllm.core.Scheduler``
plans one (KV cache never short): every decoding sequence gets one row, then the running partial prefills get
what is left of the ``max_num_batched_tokens`` budget, then waiting requests are admitted first come first served
while fewer than ``max_num_seqs`` run, a prompt that does not fit being chunked when fewer than
``max_num_partial_prefills`` prompts are mid-prefill. As in the scheduler, a plan accounts for its step at once.
With asynchronous scheduling (minivllm's default on a GPU) step k+1 is planned when step k starts, before step k's
tokens are known: a request arriving during step k joins step k+2, and a sequence that ends in step k holds its
slot until step k+2 is planned. A request's first token comes at the end of the step that computes its last
prompt token; it then decodes one token a step. Steps cost ``CostModel.step_ms``.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass

ROUTERS = ("least-loaded", "random", "p2c")


@dataclass(frozen=True)
class CostModel:
    """Milliseconds of one engine step: ``fixed + per_row * decode rows + per_context * keys the decode rows attend
    to + per_prefill * prompt tokens computed``."""

    fixed_ms: float
    per_decode_row_ms: float
    per_context_token_ms: float
    per_prefill_token_ms: float

    def step_ms(self, decode_rows: int, context_tokens: int, prefill_tokens: int) -> float:
        """One step's time for its decode rows, their summed context and its prompt tokens."""
        return (self.fixed_ms + self.per_decode_row_ms * decode_rows + self.per_context_token_ms * context_tokens
                + self.per_prefill_token_ms * prefill_tokens)


@dataclass(frozen=True)
class Limits:
    """The scheduler settings that shape a step (minivllm's ``SchedulerConfig`` defaults; asynchronous scheduling
    on, as on a GPU)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    max_num_partial_prefills: int = 1
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        # NOTE: with budget >= max_num_seqs every decode row fits in every step, so decodes advance in lockstep
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")


class Request:
    """One request: its sizes, and the times the simulation fills in (seconds)."""

    __slots__ = ("arrival", "prompt_len", "output_len", "replica", "first_token", "finish")

    def __init__(self, arrival: float, prompt_len: int, output_len: int):
        self.arrival, self.prompt_len, self.output_len = arrival, prompt_len, output_len
        self.replica, self.first_token, self.finish = -1, None, None


def plan_step(limits: Limits, num_decode: int, prefilling: list[list], waiting: deque,
              held: int = 0) -> tuple[list[tuple], int]:
    """This step's prompt chunks ``[(request, tokens)]`` and how many waiting requests it admits (from the head).

    ``prefilling``: ``[request, tokens left]`` of the running partial prefills, oldest first; ``held``: running
    sequences with no row (their last token is in flight).
    """
    budget = limits.max_num_batched_tokens - num_decode
    chunks, partial = [], 0
    for req, left in prefilling:
        if budget <= 0:
            break
        n = min(left, budget)
        partial += n < left
        chunks.append((req, n))
        budget -= n
    running, admitted = num_decode + len(prefilling) + held, 0
    for req in waiting:
        if budget <= 0 or running >= limits.max_num_seqs:
            break
        n = min(req.prompt_len, budget)
        if n < req.prompt_len and partial >= limits.max_num_partial_prefills:
            break
        partial += n < req.prompt_len
        chunks.append((req, n))
        budget, running, admitted = budget - n, running + 1, admitted + 1
    return chunks, admitted


@dataclass(slots=True)
class Step:
    """A planned step: its decode rows, prompt chunks, time, and the requests it gives a first or last token."""

    rows: int
    chunks: list[tuple]
    ms: float
    firsts: list[Request]
    done: list[Request]


class Replica:
    """One engine: its queues, decode bookkeeping in aggregate (rows, summed context) and its steps."""

    def __init__(self, cost: CostModel, limits: Limits):
        self.cost, self.limits = cost, limits
        self.waiting: deque[Request] = deque()
        self.prefilling: list[list] = []  # [request, prompt tokens not yet planned]
        self.num_decode = self.context = self.held = self.in_flight = self.planned = 0
        self.finishing: dict[int, list[Request]] = {}  # plan number -> requests whose last token it makes
        self.current: Step | None = None  # the step running
        self.next: Step | None = None  # the step planned to run after it

    def add(self, req: Request) -> None:
        """Queue a request routed here."""
        self.waiting.append(req)
        self.in_flight += 1

    def has_work(self) -> bool:
        """Whether a step would compute anything."""
        return bool(self.next or self.num_decode or self.prefilling or self.waiting)

    def _plan(self) -> Step | None:
        """Plan a step and account for it (the scheduler's ``schedule``); None when it would be empty."""
        chunks, admitted = plan_step(self.limits, self.num_decode, self.prefilling, self.waiting, self.held)
        if not chunks and not self.num_decode:
            return None
        for _ in range(admitted):
            req = self.waiting.popleft()
            self.prefilling.append([req, req.prompt_len])
        rows, k = self.num_decode, self.planned
        prefill = sum([n for _, n in chunks]) if chunks else 0
        step = Step(rows, chunks, self.cost.step_ms(rows, self.context, prefill), [], self.finishing.pop(k, []))
        self.planned += 1
        self.context += rows  # NOTE: every decode row adds one token to its context
        for req in step.done:
            self.num_decode -= 1
            self.context -= req.prompt_len + req.output_len
        if chunks:  # NOTE: the chunks are the first prompts of the prefilling list, in its order
            still = []
            for (req, left), (_, n) in zip(self.prefilling, chunks):
                if left > n:
                    still.append([req, left - n])
                    continue
                step.firsts.append(req)
                if req.output_len == 1:
                    step.done.append(req)
                else:
                    self.num_decode += 1
                    self.context += req.prompt_len + 1
                    self.finishing.setdefault(k + req.output_len - 1, []).append(req)
            self.prefilling = still + self.prefilling[len(chunks):]
        self.held += len(step.done)
        return step

    def start_step(self, now: float) -> float:
        """Start the next step at ``now`` (planning it unless it was), and with asynchronous scheduling plan the
        one after; returns when the step ends."""
        step = self.next or self._plan()
        self.current, self.next = step, None
        if self.limits.async_scheduling:
            self.next = self._plan()
        return now + step.ms / 1000.0

    def end_step(self, now: float) -> tuple[int, int]:
        """The running step's tokens reach the host at ``now``: ``(tokens emitted, first tokens among them)``."""
        step, self.current = self.current, None
        for req in step.firsts:
            req.first_token = now
        for req in step.done:
            req.finish = now
        self.held -= len(step.done)
        self.in_flight -= len(step.done)
        return step.rows + len(step.firsts), len(step.firsts)


def choose_replica(router: str, replicas: list[Replica], rng: random.Random) -> int:
    """The replica a new request goes to: fewest in flight (ties: lowest index), uniform, or the less loaded
    of two distinct ones drawn at random (power of two choices)."""
    n = len(replicas)
    if router == "least-loaded":
        loads = [r.in_flight for r in replicas]
        return loads.index(min(loads))
    if router == "random":
        return rng.randrange(n)
    if router == "p2c":
        i, j = rng.sample(range(n), 2) if n > 1 else (0, 0)
        return min((replicas[i].in_flight, i), (replicas[j].in_flight, j))[1]
    raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")


@dataclass
class SimResult:
    """A run's requests (times filled in), each step's end time and tokens emitted, and the replicas."""

    requests: list[Request]
    step_end: list[float]
    step_tokens: list[int]
    replicas: list[Replica]

    def tokens_between(self, t0: float, t1: float) -> int:
        """Output tokens of the steps that ended in ``(t0, t1]``."""
        return sum(k for t, k in zip(self.step_end, self.step_tokens) if t0 < t <= t1)


def simulate(requests: list[Request], num_replicas: int, cost: CostModel, limits: Limits = Limits(),
             router: str = "least-loaded", seed: int = 0, router_overhead_ms: float = 0.0,
             stop_at: float | None = None, until_first_tokens: bool = False) -> SimResult:
    """Route ``requests`` (sorted by arrival) to ``num_replicas`` engines and run every step.

    Stops when all is done, at ``stop_at`` (seconds), or with ``until_first_tokens`` once every request has its
    first token. A request reaches its replica ``router_overhead_ms`` after it arrives.
    """
    replicas = [Replica(cost, limits) for _ in range(num_replicas)]
    rng = random.Random(seed)
    hop = router_overhead_ms / 1000.0
    ends: list[tuple[float, int]] = []  # (step end, replica)
    step_end, step_tokens = [], []
    nxt, started, total, inf = 0, 0, len(requests), float("inf")
    while True:
        t_arr = requests[nxt].arrival + hop if nxt < total else inf
        t_end = ends[0][0] if ends else inf
        now = t_arr if t_arr < t_end else t_end
        if now == inf or (stop_at is not None and now > stop_at):
            break
        if until_first_tokens and nxt == total and started == total:
            break
        if t_end <= t_arr:  # NOTE: a step ending when a request arrives frees its slots first
            _, i = heapq.heappop(ends)
            rep = replicas[i]
            tokens, first = rep.end_step(now)
            started += first
            step_end.append(now)
            step_tokens.append(tokens)
        else:
            req, nxt = requests[nxt], nxt + 1
            req.replica = i = choose_replica(router, replicas, rng)
            rep = replicas[i]
            rep.add(req)
        if rep.current is None and rep.has_work():
            heapq.heappush(ends, (rep.start_step(now), i))
    return SimResult(requests, step_end, step_tokens, replicas)
