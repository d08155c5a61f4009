"""A directory whose disk can be made to stall: a FUSE pass-through filesystem (fusepy over
Debian's libfuse2) mounted on a test's temporary directory, whose fsync waits while `stall`
is set, as a disk that stopped completing writes does (its other calls go through). A broker
whose data directory is there sees its syncs hang, nothing else."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time

try:
    from fuse import FUSE, FuseOSError, Operations
except (ImportError, OSError, EnvironmentError) as err:  # (no libfuse: fusepy fails to load it)
    FUSE = None
    UNAVAILABLE: str | None = f"fusepy cannot run: {err}"
else:
    UNAVAILABLE = None if os.path.exists("/dev/fuse") else "no /dev/fuse"


class Passthrough(Operations):
    """Every call on `root`'s files, fsync waiting while `stall` is set."""

    use_ns = True  # (times in nanoseconds, fusepy's newer convention)

    def __init__(self, root: str):
        self.root = root
        self.stall = threading.Event()
        self.stalled_syncs = 0  # fsyncs that had to wait

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _wait(self) -> None:
        if self.stall.is_set():
            self.stalled_syncs += 1
            while self.stall.is_set():
                time.sleep(0.02)

    def access(self, path, mode):  # (fusepy answers an OSError with its errno)
        if not os.access(self._full(path), mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        return os.chmod(self._full(path), mode)

    def chown(self, path, uid, gid):
        return os.chown(self._full(path), uid, gid)

    def getattr(self, path, fh=None):
        st = os.lstat(self._full(path))
        return {key: getattr(st, key) for key in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                                  "st_nlink", "st_size", "st_uid")}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._full(path))]

    def readlink(self, path):
        return os.readlink(self._full(path))

    def mknod(self, path, mode, dev):
        return os.mknod(self._full(path), mode, dev)

    def rmdir(self, path):
        return os.rmdir(self._full(path))

    def mkdir(self, path, mode):
        return os.mkdir(self._full(path), mode)

    def statfs(self, path):
        st = os.statvfs(self._full(path))
        return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                  "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def unlink(self, path):
        return os.unlink(self._full(path))

    def symlink(self, name, target):
        return os.symlink(target, self._full(name))

    def rename(self, old, new):
        return os.rename(self._full(old), self._full(new))

    def link(self, target, name):
        return os.link(self._full(name), self._full(target))

    def utimens(self, path, times=None):
        return os.utime(self._full(path), ns=times) if times else os.utime(self._full(path))

    def open(self, path, flags):
        return os.open(self._full(path), flags)

    def create(self, path, mode, fi=None):  # (fusepy does not pass the flags: read and write)
        return os.open(self._full(path), os.O_RDWR | os.O_CREAT, mode)

    def read(self, path, length, offset, fh):
        return os.pread(fh, length, offset)

    def write(self, path, buf, offset, fh):
        return os.pwrite(fh, buf, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._full(path), length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        return os.close(fh)

    def fsync(self, path, datasync, fh):
        self._wait()
        return os.fdatasync(fh) if datasync else os.fsync(fh)

    def fsyncdir(self, path, datasync, fh):
        self._wait()
        return 0


class StallingDir:
    """`path`: a mount of `backing` (a directory) that stalls on demand (`stall()`, `resume()`)."""

    def __init__(self, backing: str, path: str):
        assert FUSE is not None, UNAVAILABLE
        os.makedirs(backing, exist_ok=True)
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.ops = Passthrough(backing)
        self._thread = threading.Thread(target=FUSE, args=(self.ops, path),
                                        kwargs={"foreground": True, "nothreads": False}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not os.path.ismount(path):
            assert time.monotonic() < deadline, "the FUSE mount did not come up"
            time.sleep(0.05)

    def stall(self) -> None:
        self.ops.stall.set()

    def resume(self) -> None:
        self.ops.stall.clear()

    def close(self) -> None:
        self.resume()
        subprocess.run(["fusermount", "-u", "-z", self.path], capture_output=True, timeout=30)
        self._thread.join(10)
