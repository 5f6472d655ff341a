"""StructuredOutputManager: compiles requests' grammars off the engine thread, keeps one grammar state per
constrained sequence, and fills the token bitmask of a step's constrained rows.

Compiled grammars are cached by constraint (``StructuredOutputsParams.key``): a sequence starts from a copy of
the cached template, so a schema used by many requests compiles once. Compiling runs on a worker thread; a
request whose grammar is not ready yet waits here (``submit``), outside the scheduler, until the engine's step
takes it (``take_compiled``), so a large schema never stalls the other requests' steps.

The engine's step calls it at named points: ``take_compiled`` (admission), ``constrains`` (does a step's
sampling wait for masks?), ``fill_async`` (fill them while the forward runs, once the grammars hold every
earlier token), ``bitmask`` (fill them now), ``accept`` (advance a sequence by its new token).

A grammar may start after a marker (``StructuredOutputsParams.starts_after``, the reasoning's end): until the
sequence's output ends with it, its ``ReasoningGate`` is closed, the grammar is neither applied nor advanced, and
its row gets no mask. An undecided gate (``opened_by``) masks the first token with the grammar's tokens and the
reasoning's start token, which then closes it.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from minivllm.config import StructuredOutputsConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.engine.structured_output.backend import BITS, Grammar, GuidanceBackend, bitmask_words
from minivllm.engine.structured_output.reasoning_gate import ReasoningGate
from minivllm.structured_outputs_params import StructuredOutputsParams


@dataclass(frozen=True)
class GrammarBitmask:
    """The masks of a step's constrained rows: ``bitmask[j]`` (packed, bit ``t % 32`` of word ``t // 32``)
    lists the tokens row ``rows[j]`` of the step's sampled rows may take. In a step with speculative drafts
    ``rows`` index the step's verified positions instead (a sampled row with ``d`` drafts owns ``d + 1``
    consecutive ones; without drafts, positions and rows are the same)."""

    rows: tuple[int, ...]
    bitmask: torch.Tensor  # [len(rows), ceil(V / 32)] int32, on the host


class StructuredOutputManager:
    """Grammars of one engine. ``prepare`` / ``submit`` compile (cached); ``start`` gives a sequence its state;
    ``accept`` advances it; ``bitmask`` fills a step's masks; ``drop`` forgets a sequence."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int],
                 config: StructuredOutputsConfig | None = None):
        config = config or StructuredOutputsConfig()
        self.backend = GuidanceBackend(tokenizer, vocab_size, eos_token_ids)
        self.vocab_size = vocab_size
        self.cache_size = config.structured_outputs_cache_size
        self.num_threads = config.structured_outputs_threads or max(1, min(8, os.cpu_count() or 1))
        self._cache: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # compiles grammars
        self._mask_pool: concurrent.futures.ThreadPoolExecutor | None = None  # fills masks
        self._executor = None  # llguidance's thread pool for the parallel mask fill
        self.grammars: dict[int, Grammar] = {}  # seq id -> its grammar state
        self.gates: dict[int, ReasoningGate] = {}  # seq id -> its gate, until it opens (``grammars``' ids)
        self._compiling: dict[str, concurrent.futures.Future] = {}  # request id -> its grammar's compilation

    # ------------------------------------------------------------------ compile
    def prepare(self, so: StructuredOutputsParams):
        """The compiled template of ``so`` (from the cache, else compiled here); ValueError naming the field
        for an invalid constraint. Blocking and thread-safe: call it off the engine thread."""
        key = so.key()
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
                return template
        template = self.backend.compile(so)
        with self._lock:
            self._cache[key] = template
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return template

    def cached(self, so: StructuredOutputsParams) -> bool:
        """Whether ``so`` is compiled already (``prepare`` returns at once)."""
        with self._lock:
            return so.key() in self._cache

    # ------------------------------------------------------------------ admission
    def submit(self, request_id: str, so: StructuredOutputsParams) -> None:
        """Compile ``so`` on the compile thread for request ``request_id``, which waits until ``take_compiled``
        hands it back."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="minivllm-grammar")
        self._compiling[request_id] = self._pool.submit(self.prepare, so)

    @property
    def num_compiling(self) -> int:
        """Requests whose grammar is being compiled."""
        return len(self._compiling)

    def cancel(self, request_id: str) -> bool:
        """Forget a request waiting for its grammar; False if none was."""
        return self._compiling.pop(request_id, None) is not None

    def take_compiled(self, wait: bool = False) -> list[tuple[str, object | None, BaseException | None]]:
        """``(request id, template, None)`` of each request whose grammar is compiled, ``(request id, None,
        error)`` of each whose grammar failed; ``wait``: first wait a moment for one (nothing else can run)."""
        if wait and self._compiling:
            concurrent.futures.wait(list(self._compiling.values()), timeout=0.05,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        done = []
        for request_id, fut in list(self._compiling.items()):
            if fut.done():
                del self._compiling[request_id]
                error = fut.exception()
                done.append((request_id, None if error is not None else fut.result(), error))
        return done

    def validate(self, so: StructuredOutputsParams) -> None:
        """Check the constraint now, without compiling it for the tokenizer (ValueError naming the field)."""
        import llguidance

        if self.cached(so):
            return
        error = llguidance.LLMatcher.validate_grammar(self.backend.grammar_text(so))
        if error and not error.startswith("WARNING"):
            raise ValueError(f"structured_outputs.{so.kind} is invalid: {error.strip()}")

    # ------------------------------------------------------------------ sequences
    def start(self, seq_id: int, template, starts_after: tuple[int, ...] = (), opened_by: int | None = None) -> None:
        """Sequence ``seq_id`` starts at the beginning of ``template``'s grammar, or, with ``starts_after``, once
        its output ends with those token ids (with ``opened_by``: if its first token is that one)."""
        if starts_after:
            self.gates[seq_id] = ReasoningGate(tuple(starts_after), opened_by)
        self.grammars[seq_id] = Grammar(template.deep_copy())

    def accept(self, seq_id: int, token_id: int) -> bool:
        """Advance ``seq_id``'s grammar by its new token; True when the output is now complete (or the grammar
        failed: nothing more can be generated under it). A token before the grammar starts does not advance it."""
        g = self.grammars.get(seq_id)
        if g is None:
            return False
        gates = self.gates
        if gates and seq_id in gates:
            gate = gates[seq_id]
            if gate.undecided:  # the first token: does the model open its reasoning?
                if token_id == gate.opened_by and not g.allows(token_id):
                    gate.opened_by = None  # closed until the end marker
                    return False
                del gates[seq_id]  # no reasoning: this token is the grammar's
            else:
                if gate.push(token_id):
                    del gates[seq_id]  # the grammar applies from the next token
                return False
        if not g.is_stopped:
            g.accept(token_id)
        return g.is_stopped

    def drop(self, seq_id: int) -> None:
        self.grammars.pop(seq_id, None)
        self.gates.pop(seq_id, None)

    def check_integrity(self) -> None:
        """Raise AssertionError unless every gate (closed or undecided) belongs to a sequence with a grammar."""
        stray = set(self.gates) - set(self.grammars)
        assert not stray, f"gates of sequences without a grammar: {sorted(stray)}"

    def constrains(self, out: SchedulerOutput) -> bool:
        """Whether a sampled row of ``out`` is under a grammar (its sampling then waits for the masks).

        NOTE: a row whose gate is closed counts too: with asynchronous scheduling the step in flight may end the
        marker, and this step's token must then follow the grammar, whose masks are filled only after that."""
        grammars = self.grammars
        return bool(grammars) and any(s.seq_id in grammars for s in out.sampled)

    def bitmask(self, out: SchedulerOutput) -> GrammarBitmask | None:
        """The masks of ``out``'s constrained sampled rows, each row's grammar advanced to its newest token
        (None: no row is constrained). A stopped grammar's row allows every token: its token is dropped. A row
        whose gate is closed is free; an undecided one also allows the reasoning's start token."""
        rows, matchers, openers = [], [], []
        gates = self.gates
        position = 0  # the row's first verified position (its row index when no row has drafts)
        for s in out.sampled:
            first, position = position, position + 1 + s.num_draft_tokens
            g = self.grammars.get(s.seq_id)
            if g is None:
                continue
            gate = gates.get(s.seq_id) if gates else None
            if gate is not None:
                if not gate.undecided:
                    continue
                openers.append((len(rows), gate.opened_by))
            drafts = s.token_ids[len(s.token_ids) - s.num_draft_tokens:]
            matchers.append(None if g.is_stopped else (g.matcher, len(rows), drafts))
            rows.extend(range(first, position))
        if not rows:
            return None
        mask = torch.full((len(rows), bitmask_words(self.vocab_size)), -1, dtype=torch.int32)  # [R, W]
        live = [m for m in matchers if m is not None]
        if live:
            import llguidance
            from llguidance.torch import (
                fill_next_token_bitmask_par,
                fill_next_token_bitmask_par_with_draft_tokens,
            )

            if self._executor is None:
                self._executor = llguidance.LLExecutor(self.num_threads)
            drafting = [m for m in live if m[2]]
            if drafting:
                # each draft position's mask is the grammar's after the drafts before it (advanced, then rolled
                # back); past a draft it refuses, no token is allowed: those positions are never reached
                fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafting, mask)
                mask[(mask == 0).all(dim=1)] = -1  # unreached positions: no all -inf rows
            if len(drafting) < len(live):
                fill_next_token_bitmask_par(self._executor, [(m, j) for m, j, d in live if not d], mask)
        for j, token in openers:
            word, bit = divmod(token, BITS)
            mask[j, word] |= (1 << bit) - (1 << BITS if bit == BITS - 1 else 0)  # the bit, as a signed int32
        return GrammarBitmask(tuple(rows), mask)

    def fill_async(self, out: SchedulerOutput) -> concurrent.futures.Future:
        """``bitmask(out)`` on the mask thread (llguidance fills rows in parallel, without Python's lock)."""
        if self._mask_pool is None:
            self._mask_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="minivllm-mask")
        return self._mask_pool.submit(self.bitmask, out)

    def close(self) -> None:
        self._compiling.clear()
        for pool in (self._pool, self._mask_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._mask_pool = None
