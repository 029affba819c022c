"""RESP, Redis's wire format, for the lean load generator (redis_load.py): commands encoded by hand, and the replies
read back by hiredis (redis-py's own C parser) where it is installed, by a small Python parser otherwise."""

from __future__ import annotations

try:  # NOTE: optional: redis-py's own C parser where installed; the Python one below otherwise
    import hiredis
except ImportError:  # pragma: no cover
    hiredis = None


def command(*args: object) -> bytes:
    """One Redis command in RESP."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts += (b"$%d\r\n" % len(b), b, b"\r\n")
    return b"".join(parts)


def bulk(a: object) -> bytes:
    b = str(a).encode()
    return b"$%d\r\n%s\r\n" % (len(b), b)


class _HiredisReplies:
    """RESP replies read by hiredis (the C parser redis-py uses where it is installed)."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()  # type: ignore[union-attr]

    def feed(self, data: bytes) -> None:
        self.reader.feed(data)

    def get(self) -> object | None:
        reply = self.reader.gets()
        return None if reply is False else reply


def reader() -> _HiredisReplies | _Replies:
    return _HiredisReplies() if hiredis is not None else _Replies()


class _Replies:
    """RESP2 replies read off one connection (what the sync script answers: arrays, bulk strings, integers, nil)."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data

    def get(self) -> object | None:
        """The next whole reply (removed from the buffer), or None while incomplete."""
        try:
            reply, at = self._parse(0)
        except (IndexError, ValueError):  # NOTE: ran past the end of what has arrived
            return None
        self.buf = self.buf[at:]
        return reply

    def _parse(self, at: int) -> tuple[object, int]:
        end = self.buf.index(b"\r\n", at)
        kind, line = self.buf[at : at + 1], self.buf[at + 1 : end]
        at = end + 2
        if kind == b"*":
            items = []
            for _ in range(int(line)):
                item, at = self._parse(at)
                items.append(item)
            return items, at
        if kind == b"$":
            n = int(line)
            if n < 0:
                return None, at
            if len(self.buf) < at + n + 2:
                raise IndexError
            return self.buf[at : at + n], at + n + 2
        if kind == b":":
            return int(line), at
        if kind == b"-":
            raise RuntimeError(line.decode())
        return line, at
