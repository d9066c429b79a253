#!/usr/bin/env python3
"""Server time of the Redis acquire and release fast paths, per script version.

    scripts/redis-script-cost.py --port PORT [--seconds S] [--perf-pid PID] VERSION...

VERSION is LABEL=SOURCE, SOURCE a git revision (its src/backend/redis/*.lua)
or a directory holding acquire.lua, release.lua and common.lua (spliced at
`-- @helpers`, as scripts.rs does). Needs a redis-server of your own on
127.0.0.1:PORT: the script FLUSHALLs it and resets its stats.

One client, serial calls, like lockbench `serial`: every cycle a fresh lock
key (free, nobody queued: the acquire fast path), acquire, then release
(flag 0: the release fast path). Versions alternate in rounds of 200 cycles,
so the shared machine's drift hits them alike. Per round, `CONFIG RESETSTAT`
and `INFO commandstats` give EVALSHA's usec_per_call, separately for the
acquires and the releases; printed: the median over the rounds. With
--perf-pid (the server's pid; needs `perf`), also the server's user-space
instructions per call (`perf stat -e instructions:u`), the median over
rounds: steadier than time on a busy machine. TTLs are 600 s, so no key
expires during a run.

    scripts/redis-script-cost.py --port PORT --perf-pid PID --protocols

instead prices whole lock cycles in server instructions (median of rounds):
the raw loop (`SET NX PX` + compare-and-delete `EVALSHA`), tower-lock's two
scripts (this working tree's), and a script-less acquire that keeps the fence
counter and the queued-waiters check (`MULTI` `EXISTS` `INCR` `SET NX PX`
`EXEC`, not what tower-lock does: it cannot store the fence in the value)
followed by tower-lock's release. A `DEL` alone is printed for scale.
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid

ROUND = 200
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")

    def cmd(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.s.sendall(b"".join(out))
        return self.read()

    def read(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("bad reply %r" % line)


def crc16(data):
    """CRC16-XMODEM, Redis Cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


_SLOT_TAGS = {}


def counter_key(prefix, lock_key):
    """The per-slot fence counter of `lock_key` (src/backend/redis/keys.rs)."""
    tag = lock_key[lock_key.index("{") + 1:lock_key.index("}")]
    slot = crc16(tag.encode()) % 16384
    if not _SLOT_TAGS:
        alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
        import itertools
        for n in range(1, 5):
            for t in itertools.product(alphabet, repeat=n):
                t = "".join(t)
                _SLOT_TAGS.setdefault(crc16(("fence:" + t).encode()) % 16384, t)
            if len(_SLOT_TAGS) == 16384:
                break
    return "%s{fence:%s}" % (prefix, _SLOT_TAGS[slot])


def lock_keys(per_slot, k):
    """KEYS of a version's scripts: per-slot counters (and the legacy
    per-key counter last) since the per-slot change, per-key before."""
    if per_slot:
        # The holds (shared holds and permits) last: versions before them
        # ignore an extra key.
        return [k, counter_key("lockbench:", k), k + ":q", k + ":w", k + ":fence", k + ":h"]
    return [k, k + ":fence", k + ":q", k + ":w"]


def read_source(source, name):
    if os.path.isdir(source):
        with open(os.path.join(source, name)) as f:
            return f.read()
    return subprocess.run(
        ["git", "-C", ROOT, "show", "%s:src/backend/redis/%s" % (source, name)],
        check=True, capture_output=True, text=True).stdout


def script(source, name):
    return read_source(source, name).replace("-- @helpers\n", read_source(source, "common.lua"), 1)


def evalsha_usec_per_call(c):
    for line in c.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            kv = dict(p.split("=") for p in line.split(":", 1)[1].split(","))
            return int(kv["usec"]) / int(kv["calls"])
    raise RuntimeError("no EVALSHA in commandstats")


def measured(c, pid, calls):
    """Run `calls`, return (usec per call, user instructions per call or None)."""
    c.cmd("CONFIG", "RESETSTAT")
    perf = None
    if pid:
        perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "instructions:u", "-p", str(pid)],
                                stderr=subprocess.PIPE, text=True)
        time.sleep(0.2)
    n = calls()
    ins = None
    if perf:
        perf.send_signal(signal.SIGINT)
        err = perf.communicate()[1]
        ins = [int(l.split(",")[0]) for l in err.splitlines() if "instructions" in l][0] / n
    return evalsha_usec_per_call(c), ins


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=5, help="per version")
    ap.add_argument("--perf-pid", type=int)
    ap.add_argument("versions", nargs="*", metavar="LABEL=SOURCE")
    ap.add_argument("--protocols", action="store_true",
                    help="price whole cycles of the raw loop and of tower-lock (needs --perf-pid)")
    args = ap.parse_args()
    c = Conn(args.port)
    c.cmd("FLUSHALL")
    if args.protocols:
        if not args.perf_pid:
            ap.error("--protocols needs --perf-pid")
        return protocols(c, args.perf_pid, args.seconds)
    if not args.versions:
        ap.error("name at least one LABEL=SOURCE, or --protocols")
    versions = []
    for spec in args.versions:
        label, source = spec.split("=", 1)
        acquire = script(source, "acquire.lua")
        versions.append({
            "label": label,
            # Since 18c6500's successor, ARGV = ttl, "<ms> - <owner>";
            # before, ARGV = owner, ttl, ms.
            "packed": "ARGV = ttl ms," in acquire,
            "per_slot": "legacy" in acquire,
            "acquire": c.cmd("SCRIPT", "LOAD", acquire),
            "release": c.cmd("SCRIPT", "LOAD", script(source, "release.lua")),
            "acq_us": [], "rel_us": [], "acq_ins": [], "rel_ins": [],
        })
    run, n = uuid.uuid4().hex[:8], 0
    end = time.time() + args.seconds * len(versions)
    rounds = 0
    while time.time() < end or rounds == 0:
        for v in versions[rounds % len(versions):] + versions[:rounds % len(versions)]:
            cycles = []
            for _ in range(ROUND):
                n += 1
                k = "lockbench:{g:%s:%d}" % (run, n)
                cycles.append((lock_keys(v["per_slot"], k), str(uuid.uuid4())))

            def acquire():
                for keys, owner in cycles:
                    ms = int(time.time() * 1000)
                    argv = ((600000, "%d - %s" % (ms, owner)) if v["packed"]
                            else (owner, 600000, ms))
                    fence = c.cmd("EVALSHA", v["acquire"], len(keys), *keys, *argv)
                    assert isinstance(fence, int), fence  # the fast path's bare integer
                return len(cycles)

            def release():
                for keys, owner in cycles:
                    # '' = any fence of the owner (release.lua's ARGV[2]; older
                    # versions ignore it).
                    assert c.cmd("EVALSHA", v["release"], len(keys), *keys, owner, "") == 1
                return len(cycles)

            for name, calls in (("acq", acquire), ("rel", release)):
                us, ins = measured(c, args.perf_pid, calls)
                v[name + "_us"].append(us)
                if ins is not None:
                    v[name + "_ins"].append(ins)
        rounds += 1
    for v in versions:
        line = "%-10s acquire %6.2f us  release %6.2f us" % (
            v["label"], statistics.median(v["acq_us"]), statistics.median(v["rel_us"]))
        if v["acq_ins"]:
            line += "  | instructions:u acquire %6.0f  release %6.0f" % (
                statistics.median(v["acq_ins"]), statistics.median(v["rel_ins"]))
        print(line + "  (%d rounds of %d)" % (len(v["acq_us"]), ROUND))


def pipeline(c, *commands):
    """Send `commands` in one write, read every reply."""
    out = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    c.s.sendall(b"".join(out))
    return [c.read() for _ in commands]


def protocols(c, pid, seconds):
    here = os.path.join(ROOT, "src", "backend", "redis")
    acquire = c.cmd("SCRIPT", "LOAD", script(here, "acquire.lua"))
    release = c.cmd("SCRIPT", "LOAD", script(here, "release.lua"))
    cad = c.cmd("SCRIPT", "LOAD", "if redis.call('get', KEYS[1]) == ARGV[1] then "
                "return redis.call('del', KEYS[1]) else return 0 end")

    def raw(keys, owner):
        assert c.cmd("SET", keys[0], owner, "NX", "PX", 600000) == "OK"
        assert c.cmd("EVALSHA", cad, 1, keys[0], owner) == 1

    def ours(keys, owner):
        ms = int(time.time() * 1000)
        assert isinstance(c.cmd("EVALSHA", acquire, len(keys), *keys, 600000,
                                "%d - %s" % (ms, owner)), int)
        assert c.cmd("EVALSHA", release, len(keys), *keys, owner) == 1

    def multi(keys, owner):
        ms = int(time.time() * 1000)
        replies = pipeline(c, ("MULTI",), ("EXISTS", keys[2]), ("INCR", keys[1]),
                           ("SET", keys[0], "0 - %d - %s" % (ms, owner), "NX", "PX", 600000),
                           ("EXEC",))
        assert replies[-1][0] == 0 and replies[-1][2] == "OK", replies
        assert c.cmd("EVALSHA", release, len(keys), *keys, owner) == 1

    def delete(keys, owner):
        c.cmd("DEL", keys[0])

    kinds = [("raw loop: SET NX PX + compare-and-delete EVALSHA", raw),
             ("tower-lock: acquire EVALSHA + release EVALSHA", ours),
             ("MULTI EXISTS INCR SET NX PX EXEC + release EVALSHA", multi),
             ("one DEL (for scale)", delete)]
    ins = {label: [] for label, _ in kinds}
    run, n, rounds = uuid.uuid4().hex[:8], 0, 0
    end = time.time() + seconds * len(kinds)
    while time.time() < end or rounds < 3:
        for label, cycle in kinds[rounds % len(kinds):] + kinds[:rounds % len(kinds)]:
            batch = []
            for _ in range(ROUND * 5):
                n += 1
                k = "lockbench:{g:%s:%d}" % (run, n)
                batch.append((lock_keys(True, k), str(uuid.uuid4())))

            def calls():
                for keys, owner in batch:
                    cycle(keys, owner)
                return len(batch)

            ins[label].append(measured_instructions(pid, calls))
        rounds += 1
    for label, _ in kinds:
        print("%-52s %7.0f server instructions:u per cycle (%d rounds of %d)"
              % (label, statistics.median(ins[label]), len(ins[label]), ROUND * 5))


def measured_instructions(pid, calls):
    perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "instructions:u", "-p", str(pid)],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.2)
    n = calls()
    perf.send_signal(signal.SIGINT)
    err = perf.communicate()[1]
    return [int(l.split(",")[0]) for l in err.splitlines() if "instructions" in l][0] / n


if __name__ == "__main__":
    sys.exit(main())
