"""The servers' transport (api/coalesce.py): writes made within one pass of the event loop reach the socket as one
write, in order, at the pass's end; a close or write_eof sends what is held first, an abort drops it; a mutable
buffer is copied at once; nothing is written to a transport that is closing."""

from __future__ import annotations

import pytest

from fairserve.api.coalesce import Coalesced

pytestmark = pytest.mark.unit


class Loop:
    """`call_soon` kept; `run_pass` runs what was scheduled, as the loop's next pass does."""

    def __init__(self) -> None:
        self.soon: list = []

    def call_soon(self, fn, *args):
        self.soon.append((fn, args))

    def run_pass(self) -> None:
        ready, self.soon = self.soon, []
        for fn, args in ready:
            fn(*args)


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.calls: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append("close")
        self.closing = True

    def write_eof(self) -> None:
        self.calls.append("write_eof")

    def abort(self) -> None:
        self.calls.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str):
        return ("127.0.0.1", 1) if name == "peername" else None


def test_writes_of_one_pass_go_as_one_in_order_at_its_end():
    loop, t = Loop(), Transport()
    c = Coalesced(t, loop)
    c.write(b"HTTP/1.1 200 OK\r\n\r\n")
    c.write(b"")  # nothing: no empty write, no callback
    c.writelines([b"{", b"}"])
    assert t.writes == [] and len(loop.soon) == 1 and c.get_write_buffer_size() == 7 + 21
    loop.run_pass()
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    c.write(b"next")  # the next pass: its own write
    loop.run_pass()
    assert t.writes[1:] == [b"next"] and loop.soon == []
    assert c.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest goes to the transport


def test_a_mutable_buffer_is_copied_when_written():
    loop, t = Loop(), Transport()
    c = Coalesced(t, loop)
    buf = bytearray(b"abc")
    c.write(buf)
    buf[:] = b"xyz"  # the caller reuses its buffer
    loop.run_pass()
    assert t.writes == [b"abc"]


def test_close_and_write_eof_send_what_is_held_first_abort_drops_it():
    loop, t = Loop(), Transport()
    c = Coalesced(t, loop)
    c.write(b"last")
    c.write_eof()
    assert t.writes == [b"last"] and t.calls == ["write_eof"]
    c.write(b"bye")
    c.close()
    assert t.writes == [b"last", b"bye"] and t.calls == ["write_eof", "close"]
    loop.run_pass()  # the scheduled flushes find nothing held, and the transport closing
    assert t.writes == [b"last", b"bye"]

    loop, t = Loop(), Transport()
    c = Coalesced(t, loop)
    c.write(b"dropped")
    c.abort()
    loop.run_pass()
    assert t.writes == [] and t.calls == ["abort"]
