"""The engine's side of structured outputs (a mixin of LLMEngine): requests wait outside the scheduler until
their grammar is compiled, and a step with rows under a grammar fills their masks while its forward runs."""

from __future__ import annotations

import concurrent.futures
import logging

from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.engine.request_state import RequestState

logger = logging.getLogger(__name__)


class StructuredOutputMixin:
    """For an engine with ``structured`` (a ``StructuredOutputManager`` or None), ``scheduler``, ``executor``,
    ``_awaiting_grammar``, ``_pending``, ``_inflight`` and ``_resolve``.

    NOTE: a step with rows under a grammar is launched in two halves. Its forward goes first; the engine then
    takes the previous step's tokens (which advance the grammars) and starts filling this step's masks on the
    mask thread, while the device runs the forward and the engine goes on; the next ``step()`` samples it, just
    before launching the following forward, which reads its tokens on the device.
    """

    def _schedule(self, req: RequestState, template) -> None:
        """Hand the request's sequences to the scheduler, each at the start of ``template``'s grammar if any."""
        for seq in req.seqs:
            if template is not None:
                self.structured.start(seq.seq_id, template)
            self.scheduler.add(seq)

    def _admit_compiled(self, touched: dict[str, RequestState]) -> None:
        """Schedule the requests whose grammars finished compiling (waiting a moment when nothing else can run);
        a request whose grammar failed finishes with ``abort``."""
        if self.scheduler.is_finished():
            concurrent.futures.wait([f for _, f in self._awaiting_grammar.values()], timeout=0.05,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        for request_id, (req, fut) in list(self._awaiting_grammar.items()):
            if not fut.done():
                continue
            del self._awaiting_grammar[request_id]
            if fut.exception() is None:
                self._schedule(req, fut.result())
                continue
            logger.warning("request %s: its grammar failed to compile: %s", request_id, fut.exception())
            for out in req.output.outputs:
                out.finish_reason = "abort"
            touched[request_id] = req

    def _launch(self, sched: SchedulerOutput):
        """Launch a step: forward and sampling, or, when a sampled row is under a grammar, the forward alone
        (``_pending``: sampled by ``_sample_pending`` once its masks are filled). Returns what ``_resolve`` takes,
        or None for a pending step."""
        grammars = self.structured.grammars if self.structured is not None else None
        if not grammars or not any(s.seq_id in grammars for s in sched.sampled):
            return sched, self.executor.launch(sched)
        self._pending = _PendingStep(sched, self.executor.start_step(sched))
        return None

    def _sample_pending(self) -> None:
        """Sample the pending step with its masks (waiting for them); it becomes the step in flight."""
        p, self._pending = self._pending, None
        if p is None:
            return
        masks = p.fill.result() if p.fill is not None else self.structured.bitmask(p.sched)
        self._inflight = (p.sched, self.executor.finish_step(p.forward, masks))


class _PendingStep:
    """A step whose forward is queued; ``fill``: the future of its grammar masks, once the grammars have every
    earlier token (the engine's ``_resolve`` of the step before)."""

    __slots__ = ("sched", "forward", "fill")

    def __init__(self, sched: SchedulerOutput, forward):
        self.sched, self.forward, self.fill = sched, forward, None
