"""Disk-sync latency on this machine, alone: 8 kB written and fdatasync'ed 300 times a
second for 30 s, in PostgreSQL's data directory's file system (as its WAL flushes are),
then p50/p99/max and the number of syncs over 50 ms. Run as root or the postgres user."""
import os, time, statistics
path = "/var/lib/postgresql/15/main/fsync-probe.tmp"
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
block = b"x" * 8192
lat = []
start = time.monotonic()
n = 0
try:
    while time.monotonic() - start < 30:
        due = start + n / 300
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        t = time.monotonic()
        os.pwrite(fd, block, (n % 64) * 8192)
        os.fdatasync(fd)
        lat.append((time.monotonic() - t) * 1000)
        n += 1
finally:
    os.close(fd)
    os.unlink(path)
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print(f"{len(lat)} syncs: p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, max {lat[-1]:.1f} ms, "
      f"over 50 ms: {sum(1 for x in lat if x > 50)}")
