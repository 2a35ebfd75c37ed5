"""Pipelined capture: the forward pass does not wait for batching, device→host copies or the disk.

Up to four things run at once, each on its own thread (one thread each: no pool is nested in another):

* the **feeder** (:class:`Feeder`) cuts the next windows into padded batches ahead of the model — on
  CUDA in pinned host memory, sent with ``non_blocking`` copies — with the flat index of each batch's
  real tokens, so gathering them is an ``index_select`` that never synchronises with the device;
* the **main thread** runs the model with the capture hooks and gathers the real tokens;
* on CUDA, the **side stream** (:class:`DeviceToHost`) casts each state to the stored dtype, counts its
  non-finite values and copies it into pinned host buffers that are reused (a fixed ring of slots: when
  the writer falls behind, the main thread waits for a free slot instead of growing memory);
* the **writer** (:class:`WriterThread`) runs the store's commit protocol (:class:`lens.store.writer.
  ShardWriter`: begin, positioned writes with CRCs, fsync, rename, manifest commit) in the order the
  main thread submits it, while the model computes the next batches. On CPU it also does the cast to
  the stored dtype, in chunks small enough that ATen runs them on this thread alone.

Byte identity with the serial capture: the batches are cut from the same windows with the same padding,
the states are the same copies in the same order, the cast is the same kernel, and every layer block
receives its rows in the same order, so files, CRCs and manifests are equal (tests/lens/capturing/test_pipeline.py).
Crash safety is the protocol's, unchanged: the writer thread takes the same steps in the same order,
and a fault it meets (a full disk, an injected kill) ends the capture exactly as in the serial path.

The token text of the table (one ``tokenizer.decode`` per distinct id) is decoded by a background
thread too (:class:`Background`), needed only when the first shard is finished.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
import time

import numpy as np
import torch

from lens.capturing.batches import right_padded
from lens.store.format import DTYPES, count_nonfinite
from lens.store.positions import keep_mask

GRAIN = 32768  # ATen's parallel grain: element-wise ops on fewer elements run on the calling thread only
_END = object()


class Background:
    """``fn()`` computed on a thread of its own; ``result()`` waits for it (and re-raises its error)."""

    def __init__(self, fn, name: str = "lens-background"):
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn):
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the result
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass
class Batch:
    lo: int                   # first window of the batch
    ids: torch.Tensor         # (batch, width) on the run device
    mask: torch.Tensor        # (batch, width) on the run device
    index: torch.Tensor       # flat positions of the real tokens, in window order, on the run device
    n: int                    # real tokens
    keep: tuple = ()          # host tensors a non_blocking copy still reads


def make_batch(input_ids: list, lo: int, hi: int, pad_id: int, device, pin: bool, positions="all") -> Batch:
    """Windows ``lo..hi`` padded into one batch (as the serial capture pads them). ``positions``
    (:mod:`lens.store.positions`): the batch's ``index`` and ``n`` cover only those positions of each window."""
    chunk = input_ids[lo:hi]
    ids, mask = right_padded(chunk, pad_id)
    width = ids.shape[1]
    keep = mask.astype(bool)
    if positions != "all":
        rank = np.arange(width)[None, :]
        keep &= keep_mask(rank, np.asarray([len(c) for c in chunk])[:, None], positions)
    flat = np.flatnonzero(keep.reshape(-1))  # row-major: the order of states[mask.bool()]
    host = [torch.from_numpy(a) for a in (ids, mask, flat)]
    if pin:
        host = [t.pin_memory() for t in host]
        dev = [t.to(device, non_blocking=True) for t in host]
    else:
        dev = [t.to(device) for t in host]
    return Batch(lo, dev[0], dev[1], dev[2], int(len(flat)), tuple(host) if pin else ())


def gather(states: dict, batch: Batch) -> dict:
    """The real tokens' states, (n, width) each, without a host synchronisation."""
    out = {}
    for key, v in states.items():
        flat = v.reshape(-1, v.shape[-1])
        idx = batch.index if batch.index.device == flat.device else batch.index.to(flat.device)
        out[key] = flat.index_select(0, idx)
    return out


class Feeder:
    """Batches of windows ``start..stop`` made on a background thread, ``depth`` ahead of the model."""

    def __init__(self, input_ids: list, start: int, stop: int, batch_size: int, pad_id: int, device,
                 depth: int = 3, positions="all"):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        pin = torch.device(device).type == "cuda"
        self._thread = threading.Thread(target=self._run, name="lens-feeder", daemon=True,
                                        args=(input_ids, start, stop, batch_size, pad_id, device, pin, positions))
        self._thread.start()

    def _run(self, input_ids, start, stop, batch_size, pad_id, device, pin, positions):
        try:
            for lo in range(start, stop, batch_size):
                if not self._put(make_batch(input_ids, lo, min(lo + batch_size, stop), pad_id, device, pin,
                                            positions)):
                    return
            self._put(_END)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the consuming thread
            self._put(exc)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        while True:
            item = self._q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class WriterThread:
    """Runs submitted jobs in order on one thread. A job's error stops the jobs after it (their cleanups
    still run) and is raised on the submitting thread at its next :meth:`submit` or at :meth:`close`."""

    def __init__(self, depth: int = 4):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="lens-writer", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            job, cleanup = item
            try:
                if self.error is None and not self._cancelled:
                    job()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the submitting thread
                self.error = exc
            finally:
                if cleanup is not None:
                    cleanup()

    def submit(self, job, cleanup=None) -> None:
        if self.error is not None:
            raise self.error
        self._q.put((job, cleanup))

    def close(self, cancel: bool = False) -> None:
        """Wait for the submitted jobs (``cancel``: skip those not started) and stop the thread."""
        self._cancelled = cancel
        self._q.put(None)
        self._thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


def to_storage_serial(x: torch.Tensor, dtype: str) -> tuple[np.ndarray, int]:
    """:func:`lens.store.format.to_storage_counted` for a CPU tensor, done in chunks under ATen's
    grain so it runs on the calling thread only (the writer must not start a second thread team next
    to the forward pass's). The same cast kernel: the same bytes."""
    torch_dtype = DTYPES[dtype][0]
    x = x.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    out = torch.empty(x.shape, dtype=torch_dtype)
    rows = max(1, GRAIN // max(1, x.shape[-1]))
    bad = 0
    for r in range(0, x.shape[0], rows):
        part = out[r:r + rows]
        part.copy_(x[r:r + rows])
        bad += count_nonfinite(part)
    if dtype == "bfloat16":
        return out.view(torch.int16).numpy().view(np.uint16), bad
    return out.numpy(), bad


class DeviceToHost:
    """CUDA: cast + count on the GPU, then copy on a side stream into a ring of pinned host buffers.

    ``submit`` returns a :class:`Pending` whose ``wait()`` (on the writer thread) gives the host arrays
    in the storage dtype and the non-finite counts; ``release()`` puts its buffers back in the ring."""

    def __init__(self, widths: dict, dtype: str, device, max_rows: int, slots: int = 3):
        self.dtype = dtype
        self.torch_dtype = DTYPES[dtype][0]
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.keys = list(widths)
        self._free: queue.Queue = queue.Queue()
        for _ in range(slots):
            bufs = {k: torch.empty((max_rows, w), dtype=self.torch_dtype, pin_memory=True) for k, w in widths.items()}
            self._free.put((bufs, torch.empty(len(self.keys), dtype=torch.int64, pin_memory=True)))

    def submit(self, gathered: dict, n: int) -> "Pending":
        bufs, counts = self._free.get()  # back-pressure: wait for the writer to hand a slot back
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)  # the states are computed before they are copied
        with torch.cuda.stream(self.stream):
            bad = []
            for k in self.keys:
                v = gathered[k]
                v.record_stream(self.stream)  # not reused by the allocator before this stream is done
                s = v.to(self.torch_dtype)
                bad.append(s.numel() - torch.isfinite(s).sum())
                bufs[k][:n].copy_(s, non_blocking=True)
            counts.copy_(torch.stack(bad), non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return Pending(self, bufs, counts, done, n)

    def _release(self, bufs, counts) -> None:
        self._free.put((bufs, counts))


@dataclass
class Pending:
    owner: DeviceToHost
    bufs: dict
    counts: torch.Tensor
    done: object
    n: int

    def wait(self) -> dict:
        """{key: (host array in the storage dtype, non-finite count)} once the copies have landed."""
        self.done.synchronize()
        out = {}
        for i, k in enumerate(self.owner.keys):
            t = self.bufs[k][:self.n]
            a = t.view(torch.int16).numpy().view(np.uint16) if self.owner.dtype == "bfloat16" else t.numpy()
            out[k] = (a, int(self.counts[i]))
        return out

    def release(self) -> None:
        self.owner._release(self.bufs, self.counts)




def write_pipelined(engine, win, shards, batch_size, pad_id, run_device, writer, layer_index, dtype, texts, bar,
                    delay=0.0, positions="all") -> None:
    """Capture ``shards`` (``[(window_start, window_end), ...]``) into ``writer``: the serial capture's
    steps in the same order, with batching, copies and writes overlapped with the forward pass.
    ``positions``: only those rows of each window (``win.window_offsets()`` and ``win.rows`` then
    count the kept rows)."""
    offsets = win.window_offsets()
    run_device = torch.device(run_device)
    d2h = None  # made at the first batch on CUDA, once the states' widths are seen
    feeder = Feeder(win.input_ids, shards[0][0], shards[-1][1], batch_size, pad_id, run_device,
                    positions=positions) if shards else None
    jobs = WriterThread()
    finished = False
    try:
        batches = iter(feeder) if feeder is not None else iter(())
        for s_lo, s_hi in shards:
            jobs.submit(lambda a=s_lo, b=s_hi: writer.begin(a, b, int(offsets[b] - offsets[a])))
            for lo in range(s_lo, s_hi, batch_size):
                batch = next(batches)
                if batch.lo != lo:
                    raise RuntimeError(f"pipelined capture: expected the batch at window {lo}, got {batch.lo}")
                states, _ = engine.run(batch.ids, batch.mask)
                got = gather(states, batch)
                if run_device.type == "cuda":
                    if d2h is None:
                        d2h = DeviceToHost({k: v.shape[-1] for k, v in got.items()}, dtype, run_device,
                                           max_rows=batch_size * max(map(len, win.input_ids)))
                    pending = d2h.submit(got, batch.n)
                    jobs.submit(lambda p=pending: writer.add_stored(p.wait(), layer_index, p.n), pending.release)
                else:
                    jobs.submit(lambda g=got, n=batch.n: writer.add_stored(
                        {k: to_storage_serial(v, dtype) for k, v in g.items()}, layer_index, n))
                bar.update(batch.n)
                if delay:
                    time.sleep(delay)
            sl = slice(int(offsets[s_lo]), int(offsets[s_hi]))
            jobs.submit(lambda sl=sl: writer.finish({**{k: v[sl] for k, v in win.rows.items()},
                                                     "token": texts.result()[sl]}))
        finished = True
    finally:
        if feeder is not None:
            feeder.close()
        jobs.close(cancel=not finished)
    jobs.raise_error()


__all__ = ["Background", "Batch", "make_batch", "gather", "Feeder", "WriterThread", "to_storage_serial",
           "DeviceToHost", "Pending", "write_pipelined"]
