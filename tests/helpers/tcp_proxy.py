"""A TCP proxy in front of PostgreSQL for cluster fault tests: every connection of the
instances goes through it, so a test can cut them all (as a server restart would), refuse new
ones for a while (the server is unreachable), or let every byte vanish without a word (a
partition, or a NAT that forgot the flows: nobody is told, nothing arrives). In front of a
gateway, it can freeze the connections open now — their bytes held, new connections served —
as a stopped instance (SIGSTOP) keeps its connections open and reads and says nothing."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._pipes: set[asyncio.StreamWriter] = set()
        self._gates: list[tuple[asyncio.Event, asyncio.Event]] = []  # (up, down) of each flow
        self.refusing = False
        self.silent = False  # bytes are read and dropped, both ways; connections stay open

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port or self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        self.cut()

    def upstream_ports(self) -> list[int]:
        """The local ports of the proxy's connections to the target (PostgreSQL's
        ``pg_stat_activity.client_port`` of each): the instances' connections, and no one
        else's."""
        ports = []
        for writer in self._pipes:
            peer = writer.get_extra_info("peername")
            if peer is not None and tuple(peer[:2]) == self.target:
                ports.append(writer.get_extra_info("sockname")[1])
        return ports

    def cut(self) -> None:
        """Drop every connection open through the proxy."""
        for writer in list(self._pipes):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._pipes.clear()
        for gates in self._gates:  # (a frozen flow's pumps end on the aborted transports)
            for gate in gates:
                gate.set()
        self._gates.clear()

    def freeze(self, *, up: bool = True, down: bool = True) -> None:
        """Hold the bytes of every connection open now (``up``: client to target, ``down``:
        back), for good; connections opened after pass."""
        for up_gate, down_gate in self._gates:
            if up:
                up_gate.clear()
            if down:
                down_gate.clear()

    async def refuse(self, seconds: float) -> None:
        """Cut every connection and refuse new ones (nothing listens) for ``seconds``."""
        self.refusing = True
        if self._server is not None:
            self._server.close()
            self._server = None
        self.cut()
        await asyncio.sleep(seconds)
        await self.start(self.port)
        self.refusing = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._pipes.update((writer, up_writer))
        gates = (asyncio.Event(), asyncio.Event())
        for gate in gates:
            gate.set()
        self._gates.append(gates)
        await asyncio.gather(self._pump(reader, up_writer, gates[0]),
                             self._pump(up_reader, writer, gates[1]), return_exceptions=True)
        for w in (writer, up_writer):
            self._pipes.discard(w)
            with contextlib.suppress(Exception):
                w.transport.abort()
        with contextlib.suppress(ValueError):
            self._gates.remove(gates)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    gate: asyncio.Event) -> None:
        try:
            while data := await reader.read(65536):
                await gate.wait()  # (frozen: held here, and nothing more is read)
                if self.silent:
                    continue
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
