"""Power cuts at every step of the store's commit protocol (issue 21), tested the way SQLite tests its
commit: by dropping, or garbling, every write that was not yet synced when the "power" went.

A kill (tests/lens/store/test_store_faults.py) loses no written byte: the page cache survives the process.
A power cut loses whatever the kernel had not yet put on the disk — file data written since the
file's last ``fsync``, and names created, renamed or removed in a folder since the folder's last
``fsync``. To simulate that, one capture runs with an observer on the writer's file operations
(:func:`lens.store.fsio.set_observer`) that keeps a model of the disk: each file's content as of its
last fsync, each folder's entries as of its last fsync (files and folders known by inode and
generation). After every operation it materialises two stores a power cut at that moment could
leave:

* ``lost``: every unsynced write dropped — the folder tree as of each folder's last fsync, each file
  as of its own last fsync (empty if it never was);
* ``garbled``: every name kept as it is now (metadata made it to disk), but each file with writes
  not yet synced filled with garbage of its current size.

Each distinct store is then resumed with the real ``lens capture ... --resume`` in a forked child
and must come out byte-identical to an uninterrupted capture, or be refused with exit 2 and one line
— never exit 1, never a different store. The counts are printed: ``pytest -s`` shows them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from lens.store import fsio
from tests.lens.store_harness import assert_same_store, fork_cli, run_cli

# 128 tokens in 32-token windows, 2 windows per shard: two shards with a per-layer and a single-position
# site — every step of the protocol at the first shard and at the last one (before the final commit)
ARGS = ["--corpus", "lee", "--max-tokens", "128", "--seq-len", "32", "--batch-size", "2", "--shard-tokens", "64",
        "--sites", "resid_post,embed", "--quiet"]


def argv(out: Path, resume: bool = False) -> list:
    return ["capture", "tiny-llama", *ARGS, "--out", str(out)] + (["--resume"] if resume else [])


def _garbage(rel: str, size: int) -> bytes:
    """Deterministic garbage (equal for equal name and size, so equal cuts make equal stores)."""
    out, seed = bytearray(), hashlib.sha256(f"{rel}:{size}".encode()).digest()
    while len(out) < size:
        seed = hashlib.sha256(seed).digest()
        out += seed
    return bytes(out[:size])


class DiskModel:
    """What a power cut would leave of the store folder ``root`` (see the module docstring)."""

    def __init__(self, root: Path, cuts: Path):
        self.root, self.cuts = Path(root), Path(cuts)
        self.gen: dict = {}             # inode -> generation (bumped when a file or folder is created on it)
        self.data: dict = {}            # (inode, gen) -> bytes as of the last fsync
        self.entries: dict = {}         # (inode, gen) of a folder -> {name: ((inode, gen), is_dir)} as of its last fsync
        self.dirty: set = set()         # (inode, gen) of files written since their last fsync
        self.seen: dict = {}            # image digest -> folder name
        self.n = 0
        self.mutex = threading.Lock()
        self.index = open(self.cuts / "index.jsonl", "a", buffering=1)
        # what is on the disk when the run starts is durable (a resumed store was written long ago)
        for folder, dirs, files in os.walk(self.root):
            with os.scandir(folder) as it:
                self.entries[self._key(os.stat(folder))] = {
                    e.name: (self._key(e.stat(follow_symlinks=False)), e.is_dir(follow_symlinks=False)) for e in it}
            for f in files:
                self.data[self._key(os.lstat(Path(folder) / f))] = (Path(folder) / f).read_bytes()

    def _key(self, st) -> tuple:
        return (st.st_ino, self.gen.get(st.st_ino, 0))

    def __call__(self, op, path=None, fd=None, dst=None):
        with self.mutex:
            if op in ("create", "mkdir"):
                st = os.fstat(fd) if fd is not None else os.lstat(path)
                self.gen[st.st_ino] = self.gen.get(st.st_ino, 0) + 1
                if fd is not None:
                    self.dirty.add(self._key(st))
            elif op == "write":
                self.dirty.add(self._key(os.fstat(fd)))
            elif op == "fsync":
                key = self._key(os.fstat(fd))
                with open(f"/proc/self/fd/{fd}", "rb") as fh:  # the fd may be write-only
                    self.data[key] = fh.read()
                self.dirty.discard(key)
            elif op == "fsync_dir":
                key = self._key(os.stat(path))
                with os.scandir(path) as it:
                    self.entries[key] = {e.name: (self._key(e.stat(follow_symlinks=False)), e.is_dir(follow_symlinks=False))
                                         for e in it}
            if not self._inside(path) and not self._inside(dst) and fd is None:
                return
            self.n += 1
            what = f"{op} {self._rel(path or Path(os.readlink(f'/proc/self/fd/{fd}')))}"
            for variant, build in (("lost", self._lost), ("garbled", self._garbled)):
                self._save(f"{self.n:04d}-{variant}", build, what, variant)

    def _inside(self, p) -> bool:
        return p is not None and (Path(p) == self.root or self.root in Path(p).parents)

    def _rel(self, p: Path) -> str:
        try:
            return str(Path(p).relative_to(self.root))
        except ValueError:
            return str(p)

    # ------------------------------------------------------------------ the two images
    def _lost(self, dst: Path) -> None:
        def build(key, folder: Path):
            for name, (child, is_dir) in sorted(self.entries.get(key, {}).items()):
                if is_dir:
                    (folder / name).mkdir()
                    build(child, folder / name)
                else:
                    (folder / name).write_bytes(self.data.get(child, b""))
        build(self._key(os.stat(self.root)), dst)

    def _garbled(self, dst: Path) -> None:
        for folder, dirs, files in os.walk(self.root):
            rel = Path(folder).relative_to(self.root)
            for d in dirs:
                (dst / rel / d).mkdir()
            for f in files:
                src = Path(folder) / f
                st = os.lstat(src)
                if not stat.S_ISREG(st.st_mode):
                    continue
                dirty = self._key(st) in self.dirty
                (dst / rel / f).write_bytes(_garbage(str(rel / f), st.st_size) if dirty else src.read_bytes())

    def _save(self, name: str, build, what: str, variant: str) -> None:
        tmp = self.cuts / (name + ".tmp")
        tmp.mkdir()
        build(tmp)
        digest = hashlib.sha256()
        for p in sorted(tmp.rglob("*")):
            digest.update(f"{p.relative_to(tmp)}|{p.is_dir()}|".encode())
            if p.is_file():
                digest.update(hashlib.sha256(p.read_bytes()).digest())
        h = digest.hexdigest()
        if h in self.seen:
            shutil.rmtree(tmp)
        else:
            self.seen[h] = name
            tmp.rename(self.cuts / name)
        self.index.write(json.dumps({"cut": name, "after": what, "variant": variant, "image": self.seen[h]}) + "\n")


class Recording(dict):
    """The models of a forked capture, and the child's hook: the CLI asks for its model (``lens.load_model``)
    before it touches the store, and that is where the child installs the disk model."""

    def __init__(self, models: dict, root: Path, cuts: Path):
        super().__init__(models)
        self.root, self.cuts = root, cuts

    def __getitem__(self, name):
        if not getattr(self, "installed", False):  # runs in the child only
            fsio.set_observer(DiskModel(self.root, self.cuts))
            self.installed = True
        return super().__getitem__(name)


@pytest.fixture(scope="module")
def models(tiny_llama):
    return {"tiny-llama": tiny_llama}


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    ref = tmp_path_factory.mktemp("power-cut") / "reference"
    done = run_cli(argv(ref), models)
    assert done.rc == 0, done.stderr
    assert len(json.loads((ref / "manifest.json").read_text())["shards"]) == 2
    return ref


# fresh: a capture into an empty folder, every step from the first lock and manifest to the final commit;
# resume: the --resume of a capture killed while its last shard was half written (a stale lock, a
# *.partial shard): the lock taken over, the partial shard deleted, the shard rewritten, the final commit
SCENARIOS = {"fresh": (None, ("mkdir",), 2, 4),
             "resume": ("shard.tokens-written@2", ("rmtree",), 1, 3)}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_power_cut_resumes_exactly_or_is_refused(scenario, models, reference, tmp_path):
    ref = reference
    kill, must, n_renames, n_commits = SCENARIOS[scenario]
    store, cuts = tmp_path / "recorded", tmp_path / "cuts"
    cuts.mkdir()
    store.mkdir()  # made here, so every cut image has the folder itself (a lost folder is a fresh capture)
    if kill:
        assert run_cli(argv(store), models, env={"LENS_STORE_FAULT": kill}).killed
        assert (store / "shards" / "00001.partial").is_dir() and (store / "writer.lock").exists()
    recorded = fork_cli(argv(store, resume=bool(kill)), Recording(models, store.resolve(), cuts)).wait()
    assert recorded.rc == 0, recorded.stderr
    assert_same_store(store, ref)  # observing changes nothing

    index = [json.loads(line) for line in (cuts / "index.jsonl").read_text().splitlines()]
    ops = {row["after"].split()[0] for row in index}
    assert {"create", "write", "fsync", "fsync_dir", "rename", *must} <= ops, ops
    # every step of the protocol of every shard written was cut: each shard's rename, each manifest commit
    assert sum(row["after"].startswith("rename shards/") for row in index) == 2 * n_renames
    assert sum(row["after"] == "rename manifest.json.tmp" for row in index) == 2 * n_commits
    if kill:
        assert any(row["after"] == "rmtree shards/00001.partial" for row in index)

    outcome: dict = {}
    for image in sorted({row["image"] for row in index}):
        trial = tmp_path / "trial"
        shutil.copytree(cuts / image, trial)
        resumed = run_cli(argv(trial, resume=True), models)
        if resumed.rc == 0:
            assert_same_store(trial, ref)
            outcome[image] = "identical"
        else:
            assert resumed.rc == 2, (image, resumed.stderr)  # never an internal error, never a crash
            resumed.error_line()
            outcome[image] = "refused"
        shutil.rmtree(trial)
    tally = {"cuts": len(index), "distinct stores": len(outcome), "identical": 0, "refused": 0}
    for row in index:
        tally[outcome[row["image"]]] += 1
    print(f"power cuts ({scenario}): {tally}; by variant: "
          + str({v: sum(r["variant"] == v for r in index) for v in ("lost", "garbled")}))
    assert tally["identical"] + tally["refused"] == tally["cuts"]
    # stricter than "exact or exit 2": nothing committed may be lost, so no cut may be refused either.
    # A refusal here means a commit relied on an unsynced write (a missing fsync of a file or a folder).
    refused = sorted({row["after"] for row in index if outcome[row["image"]] == "refused"})
    assert tally["refused"] == 0, f"stores refused after a power cut following: {refused}"
