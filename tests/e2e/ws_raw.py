#!/usr/bin/env python3
"""Raw TLS WebSocket probes of a tandem cloud: frames a conforming client never sends, and
connections that never speak. Each probe prints one line: what it did and how the cloud answered.
Usage: ws_raw.py PORT IDDIR PROBE...   (probes: unmasked, opcode, fragmented-ping, long-ping,
silent, tls-silent, hold:N, until:PATH, busy)"""
import base64, os, socket, ssl, struct, sys, time

port, iddir = int(sys.argv[1]), sys.argv[2]


def tls(cert=True):
    ctx = ssl.create_default_context(cafile=f"{iddir}/ca.crt")
    if cert:
        ctx.load_cert_chain(f"{iddir}/client.crt", f"{iddir}/client.key")
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")


def upgraded():
    s = tls()
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: tandem.v1\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(4096)
        if not d:
            raise SystemExit("the cloud closed during the upgrade")
        head += d
    if b" 101 " not in head.split(b"\r\n")[0]:
        raise SystemExit(f"no upgrade: {head[:80]!r}")
    return s, head.split(b"\r\n\r\n", 1)[1]


def frame(opcode, payload, fin=True, masked=True):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([mask_bit | n])
    else:
        head += bytes([mask_bit | 126]) + struct.pack(">H", n)
    if masked:
        key = os.urandom(4)
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        head += key
    return head + payload


def until_closed(s, limit, data=b""):
    """Reads until the cloud closes; returns (seconds, bytes read) or (None, bytes) at the limit."""
    s.settimeout(0.2)
    start = time.time()
    while time.time() - start < limit:
        try:
            d = s.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, ssl.SSLError, OSError):
            return time.time() - start, data
        if not d:
            return time.time() - start, data
        data += d
    return None, data


def close_code(data):
    """The status code of the first Close frame (opcode 8) the server sent, or None."""
    i = 0
    while i + 2 <= len(data):
        op, n = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if n == 126:
            n = struct.unpack(">H", data[i:i + 2])[0]; i += 2
        elif n == 127:
            n = struct.unpack(">Q", data[i:i + 8])[0]; i += 8
        if op == 8:
            return struct.unpack(">H", data[i:i + 2])[0] if n >= 2 else 1005
        i += n
    return None


def report(name, s, limit, data=b""):
    took, data = until_closed(s, limit, data)
    if took is None:
        print(f"{name}: still open after {limit} s")
    else:
        code = close_code(data)
        text = data.decode("latin-1")
        print(f"{name}: closed after {took:.1f} s, close code {code}, "
              f"error text {'yes' if 'Hello' in text or 'Busy' in text or 'connections' in text else 'no'}: "
              f"{''.join(c for c in text if c.isprintable())[-160:]}")


held = []
for probe in sys.argv[3:]:
    if probe == "unmasked":
        s, rest = upgraded(); s.sendall(frame(2, b"not masked", masked=False)); report(probe, s, 8, rest)
    elif probe == "opcode":
        s, rest = upgraded(); s.sendall(frame(3, b"reserved opcode")); report(probe, s, 8, rest)
    elif probe == "fragmented-ping":
        s, rest = upgraded(); s.sendall(frame(9, b"ping", fin=False)); report(probe, s, 8, rest)
    elif probe == "long-ping":
        s, rest = upgraded(); s.sendall(frame(9, b"p" * 200)); report(probe, s, 8, rest)
    elif probe == "silent":  # upgraded, never says Hello
        s, rest = upgraded(); report(probe, s, 15, rest)
    elif probe == "tls-silent":  # TCP connected, never starts TLS
        s = socket.create_connection(("127.0.0.1", port)); report(probe, s, 20)
    elif probe.startswith("hold:"):  # upgraded connections kept open (silent) for the next probes
        for _ in range(int(probe[5:])):
            held.append(upgraded()[0])
        print(f"{probe}: holding {len(held)} connections", flush=True)
    elif probe.startswith("until:"):  # keeps what is held until the file PATH exists (at most 60 s)
        deadline = time.time() + 60
        while not os.path.exists(probe[6:]) and time.time() < deadline:
            time.sleep(0.05)
        print(f"{probe}: held {len(held)} connections")
    elif probe == "busy":  # one more connection beyond a bound: an Error, then the close
        s, rest = upgraded(); report(probe, s, 8, rest)
    else:
        raise SystemExit(f"unknown probe {probe}")
