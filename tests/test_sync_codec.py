"""The sync's wire format (gateway/shared/codec.py): a batch and an answer survive their encoder and decoder, the
arguments are where the layout (and the script before the layout was written down) puts them, and the sync script
reads every argument and writes every answer part at the places the layout gives, in the layout's order."""

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairserve.gateway.shared.codec import (
    ANSWER,
    HEAD,
    ROWS,
    SECTIONS,
    BatchHead,
    Charge,
    Floor,
    Lease,
    LeaseAsk,
    NodeValues,
    StarvedHead,
    SyncAnswer,
    SyncBatch,
    WaitingHead,
    Weight,
    bind,
    decode,
    describe,
    encode,
    leave,
    placeholders,
)
from fairserve.gateway.shared.scripts import ANSWER_LUA, SYNC_LUA, SYNC_TEMPLATE

pytestmark = pytest.mark.unit

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
number = st.floats(allow_nan=False)
count = st.integers(min_value=-(2**40), max_value=2**40)


def rows(cls, **kinds):
    return st.lists(st.builds(cls, **kinds), max_size=4).map(tuple)


heads = st.builds(
    BatchHead,
    prefix=text,
    replica=text,
    ttl_ms=count,
    hold_ms=count,
    now_ms=st.none() | count,
    epoch=text,
    since=text,
    weights_since=text,
    pull=count,
    batch=text,
    reset=st.booleans(),
    mode=st.sampled_from(["=", "+"]),
    lifts=st.booleans(),
)
batches = st.builds(
    SyncBatch,
    head=heads,
    charges=rows(
        Charge,
        node=text,
        service=number,
        counter=number,
        lift=st.none() | number,
        base_counter=number,
        base_service=number,
    ),
    weights=rows(Weight, tenant=text, weight=number),
    seeds=rows(Weight, tenant=text, weight=number),
    backlogged=st.lists(text, max_size=4).map(tuple),
    unbacklogged=st.lists(text, max_size=4).map(tuple),
    starved=rows(StarvedHead, tenant=text, pool=text),
    backends=rows(LeaseAsk, url=text, **{f: count for f in SECTIONS[-1].fields[1:]}),
)


@given(batches)
def test_a_batch_survives_its_encoder_and_decoder(batch):
    args = encode(batch)
    assert decode(args) == batch
    assert decode([a if isinstance(a, str) else repr(a) for a in args]) == batch  # as the link sends them
    assert decode([(a if isinstance(a, str) else repr(a)).encode() for a in args]) == batch


answers = st.builds(
    SyncAnswer,
    nodes=rows(NodeValues, node=text, counter=number, service=number)
    | rows(NodeValues, node=text, counter=st.none(), service=st.none()),
    weights=rows(Weight, tenant=text, weight=number),
    floor=rows(Floor, node=text, counter=number),
    waiting=rows(WaitingHead, tenant=text, counter=number, pool=text),
    leases=rows(
        Lease, requests=count, others_wait_requests=st.booleans(), tokens=count, others_wait_tokens=st.booleans()
    ),
    replicas=count,
    epoch=text,
    since=text,
    weights_since=text,
    generation=text,
    known=st.booleans(),
)


@given(answers)
def test_an_answer_survives_its_encoder_and_decoder(answer):
    assert SyncAnswer.decode(answer.encode()) == answer


def test_each_argument_is_where_the_script_has_always_read_it():
    """One batch of distinct values against the ARGV the script read before its layout was written down (the same,
    byte for byte, as at the commit before `sync_codec.py`): a field moved in the layout moves here."""
    head = BatchHead(
        prefix="P", replica="r1", ttl_ms=3000, hold_ms=500, now_ms=None, epoch="e", since="12", weights_since="3",
        pull=8, batch="tok:4", reset=True, mode="+", lifts=False,
    )  # fmt: skip
    charge = {"node": "t1", "service": 20.0, "counter": 10.0, "lift": None, "base_counter": 1.5, "base_service": 3.0}
    lifted = {"node": "g/t2", "service": 0.1, "counter": 0.05, "lift": 7.25, "base_counter": 0, "base_service": 0.0}
    names = ("url", "limit_requests", "limit_tokens", "used_requests", "used_tokens", "need_requests", "need_tokens",
             "spare_requests", "spare_tokens", "keep_requests", "keep_tokens")  # fmt: skip
    batch = SyncBatch(
        head,
        charges=[Charge(**charge), Charge(**lifted)],
        weights=[Weight(tenant="t1", weight=2.0)],
        seeds=[Weight(tenant="t3", weight=0.5), Weight(tenant="t4", weight=3)],
        backlogged=["t1"],
        unbacklogged=["t5", "t6"],
        starved=[StarvedHead(tenant="t1", pool="http://a http://b")],
        backends=[
            LeaseAsk(**dict(zip(names, ("http://a", 20, 0, 1, 0, 2, 0, 1, 0, 1, 0), strict=True))),
            LeaseAsk(**dict(zip(names, ("http://b", 5, 100, 2, 30, 3, 40, 1, 11, 3, 41), strict=True))),
        ],
    )
    sent = [a if isinstance(a, str) else repr(a) for a in encode(batch)]
    assert sent == [
        "P", "r1", "3000", "500", "", "e", "12", "3", "8", "tok:4", "1", "+", "0",
        "2", "t1", "20.0", "10.0", "", "1.5", "3.0", "g/t2", "0.1", "0.05", "7.25", "0", "0.0",
        "1", "t1", "2.0",
        "2", "t3", "0.5", "t4", "3",
        "1", "t1",
        "2", "t5", "t6",
        '["t1", "http://a http://b"]',
        "2", "http://a", "20", "0", "1", "0", "2", "0", "1", "0", "1", "0",
        "http://b", "5", "100", "2", "30", "3", "40", "1", "11", "3", "41",
    ]  # fmt: skip
    assert leave("P", "r1", "tok") == ["P", "r1", "", "", "", "", "", "", "", "tok", "", "leave", ""]
    assert encode(SyncBatch(BatchHead("P", "r", 1, 2, 7, "", "0", "0", 8, "t:1", False, "=", True)))[4] == 7


def test_each_answer_part_is_read_from_where_the_script_puts_it():
    reply = [
        [b"a", b"b"], [b"1.5 3", None], [b"w"], [b"2.5"], [b"x", b"0.25"], [b"y", b"4", b"http://a"],
        [3, 1, 9, 0], 4, b"e1", b"17", b"5", b"2", 0,
    ]  # fmt: skip
    assert SyncAnswer.decode(reply) == SyncAnswer(
        nodes=(NodeValues(node="a", counter=1.5, service=3.0), NodeValues(node="b", counter=None, service=None)),
        weights=(Weight(tenant="w", weight=2.5),),
        floor=(Floor(node="x", counter=0.25),),
        waiting=(WaitingHead(tenant="y", counter=4.0, pool="http://a"),),
        leases=(Lease(requests=3, others_wait_requests=True, tokens=9, others_wait_tokens=False),),
        replicas=4,
        epoch="e1",
        since="17",
        weights_since="5",
        generation="2",
        known=False,
    )


def test_the_script_reads_the_sections_in_the_layouts_order():
    marked = re.findall(r"^\s*-- ARGV section: (\w+)$", SYNC_TEMPLATE, flags=re.M)
    assert marked == [s.name for s in SECTIONS]


def test_the_script_reads_every_argument_and_answers_every_part_at_the_layouts_places():
    """Every head argument, every field of a section's row and every field of the answer's rows is read or written at
    a `$section.field` place (a one-field section is read in turn, `nxt()`); the answer's parts are returned in the
    layout's order."""
    used = set(placeholders(SYNC_TEMPLATE))
    wanted = {("head", f) for f in HEAD}
    wanted |= {(s.name, f) for s in SECTIONS if not s.single for f in s.fields}
    wanted |= {(k, f) for k, cls in ROWS.items() if k != "floor" for f in cls.__dataclass_fields__}
    assert sorted(wanted - used) == []
    assert list(ANSWER_LUA) == list(ANSWER)  # the return is written from it, in the layout's order
    assert SYNC_LUA.endswith(f"return {{{', '.join(ANSWER_LUA.values())}}}\n")
    assert "$" not in SYNC_LUA.replace(describe(), "")
    assert SYNC_LUA.startswith(describe())


def test_the_places_are_the_layouts():
    assert bind("ARGV[$head.prefix] ARGV[$head.lifts] $head.width") == f"ARGV[1] ARGV[{len(HEAD)}] {len(HEAD)}"
    assert bind("$charges.node $charges.service $charges.width $backends.keep_tokens") == "0 1 6 10"
    assert bind("[$answer.tenants] [$answer.known] $lease.tokens $waiting.pool") == f"[1] [{len(ANSWER)}] 2 2"
    for wrong in ("$head.nothing", "$charges.nothing", "$nothing.node", "$answer.nothing"):
        with pytest.raises(ValueError, match=re.escape(wrong)):
            bind(wrong)


def test_the_starved_section_is_one_json_argument():
    head = BatchHead("P", "r", 1, 2, None, "", "0", "0", 8, "t:1", False, "+", True)
    args = encode(SyncBatch(head, starved=[StarvedHead("a", "u1 u2"), StarvedHead("b", "u3")]))
    assert json.loads(args[len(HEAD) + 5]) == ["a", "u1 u2", "b", "u3"]
    assert encode(SyncBatch(head))[len(HEAD) + 5] == ""
