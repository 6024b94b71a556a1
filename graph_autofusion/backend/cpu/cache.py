"""A content-addressed, size-bounded, multi-process-safe cache of compiled kernels.

One flat directory; each entry is `<digest>.so` (the artifact) plus `<digest>.c` (its source, kept
so a person can read what runs and so a crash report can point at a line). The digest is the
sha256 the compiler driver computes from everything that determines the binary, so a hit is always
safe to load. That includes the ISA the kernel is built for (`isa.IsaTarget.name`, e.g.
`x86-64-v4+avx512vnni` or `x86-64-v3`, and its flags): one cache directory shared by an AVX-512
and an AVX2 host holds both builds side by side and never hands one host the other's kernel.

Concurrency: writers build into a temporary file *in the same directory* and publish it with
`os.replace`, which is atomic on POSIX, so a reader sees either nothing or a complete file, never a
half-written one, even when the writer is killed mid-way. A per-digest `flock` lock file
(`.locks/<digest>.lock`) makes a second process that wants the same kernel wait for the first
instead of compiling it again; the lock only saves work, correctness comes from the rename.

Combined units: when several kernels are compiled into one shared object, each member's digest
becomes an *alias*, a relative symlink `<member>.so -> <unit>.so`, so a later lookup of any single
kernel still hits. Aliases weigh nothing; evicting a unit leaves its aliases dangling, which is a
miss, and the next eviction pass sweeps them.

Size: the cache is bounded by `max_bytes`; after every insertion the least recently used entries
(by modification time, which `get` refreshes explicitly rather than trusting `atime`, since most
file systems are mounted `relatime`/`noatime`) are deleted until the total fits. Deleting a
shared object that another process has already loaded is harmless on POSIX (the mapping stays).

Statistics (`stats`) count this process's lookups; `bytes` is measured on disk, so it includes
what other processes added.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from graph_autofusion.errors import InvalidConfigError

CACHE_DIR_ENV = "AUTOFUSION_CACHE_DIR"
CACHE_MAX_BYTES_ENV = "AUTOFUSION_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 1024**3
_FULL_SCAN_EVERY = 64  # insertions between full directory scans when well under the bound
ARTIFACT_SUFFIX = ".so"
SOURCE_SUFFIX = ".c"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_SECONDS = 3600.0
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class CacheStats:
    """Lookups answered from disk (`hits`), lookups that needed a build (`misses`), entries this
    process deleted to stay under the size bound (`evictions`), and the bytes now on disk."""

    hits: int
    misses: int
    evictions: int
    bytes: int

    def to_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "bytes": self.bytes}


def default_cache_dir() -> Path:
    """`$AUTOFUSION_CACHE_DIR`, else `$XDG_CACHE_HOME/graph_autofusion/kernels` (~/.cache/...)."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "graph_autofusion" / "kernels"


def _env_max_bytes() -> int:
    raw = os.environ.get(CACHE_MAX_BYTES_ENV)
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        return int(raw)
    except ValueError as exc:
        raise InvalidConfigError(
            f"{CACHE_MAX_BYTES_ENV}={raw!r} is not a whole number of bytes.", code="invalid_cache_size"
        ) from exc


def _check_digest(digest: str) -> str:
    # A digest becomes a file name: refuse anything that is not a sha256 hex string, so a caller
    # can never make the cache write outside its directory.
    if not _DIGEST.match(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return digest


def _touch(path: Path) -> None:
    # An explicit, fine-grained timestamp: the kernel's own file times tick in jiffies, which
    # would make entries created in the same millisecond tie in LRU order.
    now = time.time_ns()
    os.utime(path, ns=(now, now))


class KernelCache:
    """The on-disk kernel cache. One instance per directory per process is typical (see `default_cache`).

    Thread-safe: counters are guarded by a lock and file operations are atomic or flock-protected.
    """

    def __init__(self, root: Path | str | None = None, max_bytes: int | None = None) -> None:
        """`max_bytes` defaults to `$AUTOFUSION_CACHE_MAX_BYTES`, else 2 GiB."""
        if max_bytes is None:
            max_bytes = _env_max_bytes()
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        # A running estimate of the bytes on disk, so an insertion does not rescan the directory
        # unless the bound may be crossed (other processes' additions are seen at the next scan).
        self._approx_bytes: int | None = None
        self._puts_since_scan = 0
        try:
            self._locks_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.root):
                pass  # the directory takes new files
        except OSError as exc:
            raise InvalidConfigError(
                f"the kernel cache directory {str(self.root)!r} is not usable ({exc.strerror or exc}); "
                f"set {CACHE_DIR_ENV} to a writable directory.",
                code="cache_dir_unusable",
                path=str(self.root),
            ) from exc

    def __repr__(self) -> str:
        return f"KernelCache(root={str(self.root)!r}, max_bytes={self.max_bytes})"

    @property
    def _locks_dir(self) -> Path:
        return self.root / ".locks"

    # -- lookups -------------------------------------------------------------------------------

    def path_for(self, digest: str) -> Path:
        """Where the artifact for `digest` lives (whether or not it exists yet)."""
        return self.root / f"{_check_digest(digest)}{ARTIFACT_SUFFIX}"

    def source_path(self, digest: str) -> Path:
        """Where the C source of `digest` is kept next to its artifact."""
        return self.root / f"{_check_digest(digest)}{SOURCE_SUFFIX}"

    def contains(self, digest: str) -> bool:
        """Whether the artifact is present (no statistics, no LRU touch)."""
        return self.path_for(digest).is_file()

    def resolve(self, digest: str) -> Path | None:
        """The real shared object behind `digest` (through an alias), or None."""
        path = self.path_for(digest)
        try:
            real = path.resolve(strict=True)
        except (FileNotFoundError, RuntimeError):
            return None
        # Spell it under `root` as given, so paths compare equal to those `put` returns.
        return self.root / real.name if real.parent == self.root.resolve() else real

    def get(self, digest: str) -> Path | None:
        """The artifact's path, marking it recently used, or None (a miss)."""
        path = self.path_for(digest)
        try:
            _touch(path)
        except FileNotFoundError:
            self._count(misses=1)
            return None
        self._count(hits=1)
        return path

    def digests(self, *, aliases: bool = False) -> list[str]:
        """Digests of every shared object in the cache (plus live aliases if asked)."""
        found = [entry.name[: -len(ARTIFACT_SUFFIX)] for entry in self._artifacts()]
        if aliases:
            found += [
                entry.name[: -len(ARTIFACT_SUFFIX)] for entry in self._aliases() if os.path.exists(entry.path)
            ]
        return sorted(found)

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            hits, misses, evictions = self._hits, self._misses, self._evictions
        return CacheStats(hits=hits, misses=misses, evictions=evictions, bytes=self.disk_bytes())

    def disk_bytes(self) -> int:
        """Bytes of artifacts and sources on disk now (every process's entries)."""
        total = 0
        for entry in self._entries():
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
        return total

    # -- insertion -----------------------------------------------------------------------------

    def put(
        self,
        digest: str,
        producer: Callable[[Path], None],
        *,
        source: str | None = None,
        keep: Collection[str] = (),
    ) -> tuple[Path, bool]:
        """Make sure `digest` is cached, calling `producer(tmp_path)` to write it if it is not.

        Returns `(path, created)`: `created` is False when the artifact was already there or
        another process finished it while this one waited for the lock. `producer` must write
        the complete artifact at the path it is given (e.g. run the compiler with `-o`); it is
        published atomically only if `producer` returns, and the temporary file is removed if it
        raises. `source` is kept beside the artifact. Afterwards the cache is trimmed to
        `max_bytes`, never evicting `digest` itself or any digest in `keep`.
        """
        final = self.path_for(digest)
        with self._digest_lock(digest):
            if final.is_file():  # another process won the race (possibly as a unit alias)
                _touch(final)
                return self.resolve(digest) or final, False
            if source is not None:
                self._write_atomic(self.source_path(digest), lambda tmp: tmp.write_text(source))
            try:
                self._write_atomic(final, producer)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    self.source_path(digest).unlink()
                raise
        self._after_insert(final, keep={digest, *keep})
        return final, True

    def _after_insert(self, final: Path, keep: Collection[str]) -> None:
        size = 0
        for path in (final, final.with_suffix(SOURCE_SUFFIX)):
            with contextlib.suppress(FileNotFoundError):
                size += path.stat().st_size
        with self._lock:
            self._puts_since_scan += 1
            estimate = None if self._approx_bytes is None else self._approx_bytes + size
            self._approx_bytes = estimate
            scan = estimate is None or estimate > self.max_bytes or self._puts_since_scan >= _FULL_SCAN_EVERY
        if scan:
            self.evict(keep=keep)

    def alias(self, digest: str, target: str) -> Path:
        """Make `digest` resolve to the artifact of `target` (a kernel inside a combined unit).

        A real artifact already stored under `digest` wins: it is left alone.
        """
        link, dest = self.path_for(digest), self.path_for(target)
        if link.exists() and not link.is_symlink():
            return link
        tmp = (
            self.root
            / f"{_TMP_PREFIX}alias-{os.getpid()}-{threading.get_ident()}-{digest[:16]}{ARTIFACT_SUFFIX}"
        )
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(dest.name, tmp)
        os.replace(tmp, link)
        return link

    def import_file(self, digest: str, artifact: Path, *, source: str | None = None) -> Path:
        """Copy an artifact built elsewhere (e.g. a bundle's `kernels/`) into the cache."""
        path, _ = self.put(digest, lambda tmp: shutil.copyfile(artifact, tmp), source=source)
        return path

    def _write_atomic(self, final: Path, producer: Callable[[Path], None]) -> None:
        fd, name = tempfile.mkstemp(
            prefix=f"{_TMP_PREFIX}{final.stem[:16]}-", suffix=final.suffix, dir=self.root
        )
        os.close(fd)
        tmp = Path(name)
        try:
            producer(tmp)
            if not tmp.is_file() or (final.suffix == ARTIFACT_SUFFIX and tmp.stat().st_size == 0):
                raise RuntimeError(f"nothing was written for {final.name}")
            os.chmod(tmp, 0o644)
            _touch(tmp)
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    @contextlib.contextmanager
    def _digest_lock(self, digest: str) -> Iterator[None]:
        self._locks_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._locks_dir / f"{digest}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    # -- eviction ------------------------------------------------------------------------------

    def evict(self, *, keep: Collection[str] = (), max_bytes: int | None = None) -> int:
        """Delete least recently used entries until the cache holds at most `max_bytes`.

        Entries in `keep` are never deleted (a batch that is being loaded), so the total can stay
        above the bound when the protected entries alone exceed it. Stale temporary files of
        killed writers are removed too. Returns how many entries were deleted.
        """
        limit = self.max_bytes if max_bytes is None else max_bytes
        self._remove_stale_temporaries()
        entries: list[tuple[int, str, int]] = []  # (last use ns, digest, bytes incl. source)
        total = 0
        for artifact in self._artifacts():
            digest = artifact.name[: -len(ARTIFACT_SUFFIX)]
            try:
                st = artifact.stat()
            except FileNotFoundError:
                continue
            size = st.st_size
            with contextlib.suppress(FileNotFoundError):
                size += (self.root / f"{digest}{SOURCE_SUFFIX}").stat().st_size
            entries.append((st.st_mtime_ns, digest, size))
            total += size
        removed = 0
        if total > limit:
            for _, digest, size in sorted(entries):
                if total <= limit:
                    break
                if digest in keep:
                    continue
                self._remove(digest)
                total -= size
                removed += 1
        with self._lock:
            self._evictions += removed
            self._approx_bytes = total
            self._puts_since_scan = 0
        self._sweep_dangling_aliases()
        return removed

    def _sweep_dangling_aliases(self) -> None:
        for entry in self._aliases():
            if not os.path.exists(entry.path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def clear(self) -> None:
        """Delete every entry (statistics are kept)."""
        for artifact in self._artifacts():
            self._remove(artifact.name[: -len(ARTIFACT_SUFFIX)])
        self._sweep_dangling_aliases()

    def _remove(self, digest: str) -> None:
        # Artifact first: once it is gone the entry is a miss, whatever happens to the rest.
        for path in (
            self.root / f"{digest}{ARTIFACT_SUFFIX}",
            self.root / f"{digest}{SOURCE_SUFFIX}",
            self._locks_dir / f"{digest}.lock",
        ):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _remove_stale_temporaries(self) -> None:
        cutoff = time.time() - _STALE_TMP_SECONDS
        for entry in os.scandir(self.root):
            if entry.name.startswith(_TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)

    def _artifacts(self) -> Iterator[os.DirEntry[str]]:
        """Real shared objects (not aliases)."""
        for entry in os.scandir(self.root):
            if self._is_artifact_name(entry.name) and not entry.is_symlink():
                yield entry

    def _aliases(self) -> Iterator[os.DirEntry[str]]:
        for entry in os.scandir(self.root):
            if self._is_artifact_name(entry.name) and entry.is_symlink():
                yield entry

    @staticmethod
    def _is_artifact_name(name: str) -> bool:
        return name.endswith(ARTIFACT_SUFFIX) and bool(_DIGEST.match(name[: -len(ARTIFACT_SUFFIX)]))

    def _entries(self) -> Iterator[os.DirEntry[str]]:
        for entry in os.scandir(self.root):
            stem, _, suffix = entry.name.rpartition(".")
            if (
                f".{suffix}" in (ARTIFACT_SUFFIX, SOURCE_SUFFIX)
                and _DIGEST.match(stem)
                and not entry.is_symlink()
            ):
                yield entry

    def _count(self, *, hits: int = 0, misses: int = 0, evictions: int = 0) -> None:
        with self._lock:
            self._hits += hits
            self._misses += misses
            self._evictions += evictions


_default_caches: dict[Path, KernelCache] = {}
_default_lock = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide cache for the configured directory, so its statistics accumulate."""
    root = default_cache_dir()
    with _default_lock:
        cache = _default_caches.get(root)
        if cache is None:
            cache = _default_caches[root] = KernelCache(root)
        return cache
