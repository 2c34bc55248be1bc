#!/usr/bin/python3
"""What unauthenticated peers can make a coordinator hold (issue 21, item 2).

Opens CONNECTIONS raw HTTP/2 connections to the coordinator, and on each
STREAMS calls of a unary method (Jobs.Submit by default) whose single gRPC
message announces BYTES bytes; it sends all but the last byte, as fast as
the coordinator's flow-control windows allow, and then holds every stream
open (answering pings) for HOLD seconds. The coordinator cannot look at such
a message, or at its credentials' use, before it is complete, so whatever it
buffers meanwhile is held on behalf of a peer it knows nothing about.

Prints the coordinator's RSS (from /proc/PID/status) before, at the peak, and
after the connections are closed, and how many bytes the peer got to send.

Uses python3-h2 (Debian), not a gRPC library: a gRPC client cannot send part
of a message. Run by `tools/dev bench hostile`; plaintext only.
"""

import argparse
import select
import socket
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


class Peer:
    """One raw HTTP/2 connection to the coordinator, non-blocking."""

    def __init__(self, host, port):
        self.authority = f"{host}:{port}"
        self.sock = socket.create_connection((host, port))
        self.sock.setblocking(False)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.closed = False

    def open_call(self, path):
        """Sends the headers of a gRPC call of `path`; returns its stream id."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", self.authority), ("content-type", "application/grpc"),
            ("te", "trailers")])
        return stream

    def flush(self):
        data = self.conn.data_to_send()
        while data and not self.closed:
            try:
                n = self.sock.send(data)
                data = data[n:]
            except BlockingIOError:
                select.select([], [self.sock], [], 1.0)
            except OSError:
                self.closed = True

    def read(self):
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            self.closed = True
            return
        if not data:
            self.closed = True
            return
        for event in self.conn.receive_data(data):
            self.on_event(event)
        self.flush()

    def on_event(self, event):
        pass

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Watcher(Peer):
    """Jobs.Watch streams that never grant flow-control credit: once the
    first 64 KiB arrived, the coordinator can send nothing more on them."""

    def __init__(self, host, port, streams, job_id):
        super().__init__(host, port)
        self.received = 0
        request = job_id.encode()
        message = b"\x0a" + bytes([len(request)]) + request  # WatchJobRequest.job_id
        for _ in range(streams):
            stream = self.open_call("/cohort.v1.Jobs/Watch")
            self.conn.send_data(stream, struct.pack(">BI", 0, len(message)) + message,
                                end_stream=True)
        self.flush()

    def on_event(self, event):
        if isinstance(event, h2.events.DataReceived):
            self.received += len(event.data)  # never acknowledged: no window update


class Attacker(Peer):
    def __init__(self, host, port, streams, message_bytes, path):
        super().__init__(host, port)
        self.pending = {}  # stream id -> bytes still to send
        self.sent = 0
        for _ in range(streams):
            try:
                stream = self.open_call(path)
            except h2.exceptions.TooManyStreamsError:
                break
            # The gRPC message prefix: not compressed, BYTES long.
            self.pending[stream] = struct.pack(">BI", 0, message_bytes)
        self.body_left = {s: message_bytes - 1 for s in self.pending}
        self.flush()

    def pump(self):
        """Sends what the windows allow; False once nothing more can go."""
        progressed = False
        for stream in list(self.body_left):
            try:
                window = self.conn.local_flow_control_window(stream)
            except (h2.exceptions.StreamClosedError, KeyError):
                self.body_left.pop(stream, None)
                continue
            chunk = min(window, self.conn.max_outbound_frame_size)
            if chunk <= 0:
                continue
            prefix = self.pending.pop(stream, b"")
            body = min(chunk - len(prefix), self.body_left[stream])
            if body < 0:
                continue
            try:
                self.conn.send_data(stream, prefix + b"\0" * body)
            except h2.exceptions.StreamClosedError:
                self.body_left.pop(stream, None)
                continue
            self.sent += len(prefix) + body
            self.body_left[stream] -= body
            if self.body_left[stream] == 0:
                del self.body_left[stream]
            progressed = True
        self.flush()
        return progressed

    def on_event(self, event):
        if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
            self.body_left.pop(event.stream_id, None)

    def open_streams(self):
        return len(self.conn.streams) if not self.closed else 0


class RawCall(Peer):
    """One call whose only message is `payload`; records the trailers' status."""

    def __init__(self, host, port, path, payload):
        super().__init__(host, port)
        self.status = self.message = None
        stream = self.open_call(path)
        self.conn.send_data(stream, struct.pack(">BI", 0, len(payload)) + payload, end_stream=True)
        self.flush()

    def on_event(self, event):
        for name, value in getattr(event, "headers", None) or []:
            name = name.decode() if isinstance(name, bytes) else name
            value = value.decode() if isinstance(value, bytes) else value
            if name == "grpc-status":
                self.status = int(value)
            elif name == "grpc-message":
                self.message = value


def raw_call(args, host, port):
    """One call of --path whose only message is the bytes of --payload_hex;
    prints the gRPC status code and message from the trailers."""
    call = RawCall(host, port, args.path, bytes.fromhex(args.payload_hex))
    deadline = time.monotonic() + 10.0
    while call.status is None and not call.closed and time.monotonic() < deadline:
        select.select([call.sock], [], [], 0.1)
        call.read()
    call.close()
    print(f"grpc-status {call.status} grpc-message {call.message!r}")
    return 0 if call.status is not None else 1


def watch(args, host, port):
    before = rss_mib(args.pid)
    watchers = [Watcher(host, port, args.streams, args.watch) for _ in range(args.connections)]
    peak = before
    samples = []
    start = time.monotonic()
    while time.monotonic() - start < args.hold:
        socks = [w.sock for w in watchers if not w.closed]
        readable, _, _ = select.select(socks, [], [], 0.1)
        for w in watchers:
            if w.sock in readable:
                w.read()
        rss = rss_mib(args.pid)
        peak = max(peak, rss)
        if not samples or time.monotonic() - samples[-1][0] >= args.hold / 4:
            samples.append((time.monotonic(), rss))
    held = rss_mib(args.pid)
    for w in watchers:
        w.close()
    time.sleep(1.0)
    after = rss_mib(args.pid)
    trace = ", ".join(f"{rss:.0f}" for _, rss in samples)
    print(f"{args.connections} connection(s) x {args.streams} Watch stream(s) of {args.watch} "
          f"that never read for {args.hold:.0f} s ({sum(w.received for w in watchers)} bytes "
          f"received): coordinator RSS {before:.0f} MiB before, {trace} MiB along the way, "
          f"{peak:.0f} MiB peak, {held:.0f} MiB at the end, {after:.0f} MiB after closing")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="host:port of the coordinator")
    parser.add_argument("--pid", type=int, required=True, help="the coordinator's process id")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--streams", type=int, default=100, help="per connection")
    parser.add_argument("--bytes", type=int, default=(256 << 10) + (8 << 10),
                        help="announced message size (all but one byte is sent); default: the "
                             "coordinator's default --max_message_bytes, the most it accepts")
    parser.add_argument("--path", default="/cohort.v1.Jobs/Submit")
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--watch", default="",
                        help="instead: open --streams Jobs.Watch streams of this job on each "
                             "connection that never read past the first 64 KiB, for --hold s")
    parser.add_argument("--payload_hex", default=None,
                        help="instead: one call of --path with this message; print its status")
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    if args.payload_hex is not None:
        return raw_call(args, host, int(port))
    if args.watch:
        return watch(args, host, int(port))

    before = rss_mib(args.pid)
    attackers = [Attacker(host, int(port), args.streams, args.bytes, args.path)
                 for _ in range(args.connections)]
    peak = before
    deadline = time.monotonic() + 60.0
    idle_since = time.monotonic()
    # Send until every window is closed (nothing progresses for 1 s).
    while time.monotonic() < deadline and time.monotonic() - idle_since < 1.0:
        socks = [a.sock for a in attackers if not a.closed]
        readable, _, _ = select.select(socks, [], [], 0.05)
        for a in attackers:
            if a.sock in readable:
                a.read()
        if any(a.pump() for a in attackers if not a.closed):
            idle_since = time.monotonic()
        peak = max(peak, rss_mib(args.pid))
    sent = sum(a.sent for a in attackers)
    open_streams = sum(a.open_streams() for a in attackers)
    hold_until = time.monotonic() + args.hold
    while time.monotonic() < hold_until:
        socks = [a.sock for a in attackers if not a.closed]
        readable, _, _ = select.select(socks, [], [], 0.1)
        for a in attackers:
            if a.sock in readable:
                a.read()
        peak = max(peak, rss_mib(args.pid))
    held = rss_mib(args.pid)
    for a in attackers:
        a.close()
    time.sleep(1.0)
    after = rss_mib(args.pid)
    print(f"{args.connections} connection(s) x {args.streams} stream(s) of {args.path}, "
          f"{args.bytes} bytes announced each: sent {sent / 2**20:.1f} MiB, "
          f"{open_streams} streams open after sending; coordinator RSS {before:.0f} MiB before, "
          f"{peak:.0f} MiB peak, {held:.0f} MiB while held, {after:.0f} MiB after closing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
