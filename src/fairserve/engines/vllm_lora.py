"""The LoRA-slot rule: the lowest-counter adapter does not starve when vLLM has fewer LoRA slots (`max_loras`) than
adapters with work.

vLLM skips a waiting request whose adapter cannot get a slot (every slot is held by the adapter of a running
request) and admits the next one. The slot holders' next requests fit, so they are admitted whenever batch room
frees; their adapters never leave the slots, and the request the policy chose waits for as long as they have work
(vLLM #16876, SGLang #15129), whatever its counter.

The rule. After each engine step, the policy's next request (the head: the lowest-counter tenant's) is *blocked*
if it needs an adapter that holds no slot while all `max_loras` slots are held by running requests. Once the same
adapter has been the blocked head for more than K consecutive steps (`FAIRSERVE_LORA_WAIT_STEPS`, default 32), the
waiting queue holds back every request of any other adapter (base-model requests still go) until that adapter is
admitted: the slot holders' running requests finish, a slot frees, and the head takes it. Then the rule lets go.

Its cost: while it holds, the batch shrinks as the slot holders' requests finish (at most as long as the longest of
them still runs), once per switch of adapters; a switch comes only after the waiting adapter was the head for K
steps, so a larger K means fewer switches and a larger lead for the slot holders (K steps of their service, plus
that drain)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


def lora_id(request: Any) -> int:
    """The LoRA slot a request needs (vLLM's `lora_int_id`); 0 for the base model."""
    lora = getattr(request, "lora_request", None)
    value = getattr(lora, "lora_int_id", 0) if lora is not None else 0
    return value if isinstance(value, int) and value > 0 else 0


class HoldingQueue(Protocol):
    def hold_back(self, held: Any) -> None: ...


class LoRASlots:
    """The rule's state for one scheduler: call `begin` before and `end` after each of vLLM's scheduling passes.
    `wait_steps` is K (None: the rule is off, vLLM's behaviour)."""

    def __init__(self, max_loras: int, wait_steps: int | None) -> None:
        self.max_loras = max_loras
        self.wait_steps = wait_steps
        self.blocked = 0  # consecutive steps `target` has been the blocked head
        self.target = 0  # that adapter (0: none)
        self.held_steps = 0  # steps in which the rule held other adapters back, in all

    @property
    def holding(self) -> bool:
        return self.wait_steps is not None and self.target > 0 and self.blocked > self.wait_steps

    def begin(self, queue: HoldingQueue) -> None:
        if self.holding:
            target = self.target
            self.held_steps += 1
            queue.hold_back(lambda request: lora_id(request) not in (0, target))

    def end(self, head: Any, running: Iterable[Any]) -> None:
        """After the pass: `head` is the request the policy admits next (None: nothing waits), `running` what runs."""
        needs = lora_id(head) if head is not None else 0
        if needs:
            slots = {lora_id(r) for r in running}
            slots.discard(0)
            if needs not in slots and len(slots) >= self.max_loras:
                if needs == self.target:
                    self.blocked += 1
                else:  # NOTE: a new adapter at the head waits its own K steps (else adapters would thrash)
                    self.target, self.blocked = needs, 1
                return
        self.target, self.blocked = 0, 0
