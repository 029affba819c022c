"""The client's side of one request the proxy forwards."""

from __future__ import annotations

from starlette.types import Send

from ...api.streaming import connection_of


class Client:
    """The client's side of one request: whether it has gone (`left()`), and its connection where the server is
    uvicorn (`api.streaming.connection_of`)."""

    __slots__ = ("conn", "gone")

    def __init__(self, send: Send) -> None:
        self.conn = connection_of(send)
        self.gone = False  # the watcher saw http.disconnect

    def left(self) -> bool:
        return self.gone or (self.conn is not None and self.conn.disconnected)
