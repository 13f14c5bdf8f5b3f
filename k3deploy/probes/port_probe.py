"""Stdlib-only probe for the rendezvous port, shipped by source. On the head: `listen IP PORT N WAIT_S`
binds the port (or says who holds it) and accepts until N workers have said their rank or WAIT_S passed.
On a worker: `connect IP PORT RANK WAIT_S` dials the head (retrying until WAIT_S: the listener may come
up a moment later) and sends its rank. One JSON line each."""
import json
import os
import socket
import sys
import time

HOLDER_CHARS = 120  # of a holder's command line in a one-line failure message


def one_line(text, limit=HOLDER_CHARS):
    """`text` fit for one line of a message: control characters escaped (a newline as \\n), cut to `limit`
    characters with an ellipsis (never inside an escape)."""
    pieces = [ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text]
    if sum(len(p) for p in pieces) <= limit:
        return "".join(pieces)
    out, size = [], 0
    for piece in pieces:
        if size + len(piece) > limit - 1:
            break
        out.append(piece)
        size += len(piece)
    return "".join(out) + "\u2026"


def held_by(answer):
    """', held by pid N (cmdline)' for a failed listen's answer, one line whatever the node sent; '' when unknown."""
    who = answer.get("holder")
    return f", held by {one_line(str(who), HOLDER_CHARS + 20)}" if who else ""


def holder(port):
    """'pid N (cmdline)' of the process listening on the port, from /proc (None when it cannot tell)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                for line in fh.readlines()[1:]:
                    f = line.split()
                    if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":  # LISTEN
                        inodes.add(f[9])
        except OSError:
            pass
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            for fd in fds:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"pid {pid} ({one_line(cmd)})"
        except OSError:
            continue
    return None


def listen(ip, port, expect, wait_s):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((ip, port))
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc), "errno": exc.errno, "holder": holder(port)}
    srv.listen(64)
    print(json.dumps({"listening": True}), flush=True)
    seen, deadline = [], time.monotonic() + wait_s
    while len(seen) < expect and time.monotonic() < deadline:
        srv.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            break
        with conn:
            conn.settimeout(2.0)
            try:
                seen.append(int(conn.recv(16).decode().strip() or -1))
            except (OSError, ValueError):
                pass
    srv.close()
    return {"ok": True, "ranks": sorted(set(seen))}


def connect(ip, port, rank, wait_s):
    deadline, last = time.monotonic() + wait_s, ""
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((ip, port), timeout=max(0.2, min(2.0, deadline - time.monotonic()))) as s:
                s.sendall(str(rank).encode())
                return {"ok": True, "connect_s": round(time.monotonic() - t0, 3)}
        except OSError as exc:
            last = exc.strerror or str(exc)
            time.sleep(0.1)
    return {"ok": False, "error": last or "timed out"}


def main():
    mode, ip, port, n, wait_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    print(json.dumps(listen(ip, port, n, wait_s) if mode == "listen" else connect(ip, port, n, wait_s)))


if __name__ == "__main__":
    main()
