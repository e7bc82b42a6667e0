"""The Ray engine of the offline packer (``pack-megatron --engine ray``).

What runs where:

- counting: the input blocks (byte ranges of whole lines, ``inputs.split_blocks``) become a Ray
  Data dataset (``from_items``: no read tasks, so no task competes with the actors for CPUs) that
  ``map_batches`` sends, one block per call, to a pool of actors (one CPU each, one
  ``MegatronSFTPackedEncoder`` and tokenizer each, single-threaded). Each returns the block's
  ``counting.BlockCount`` (per conversation: cost, byte offset, index in line);
- the driver puts the blocks back in input order (``CountMerger``), bin-packs all costs with the
  configured packer and shuffles the rows: the very code of the single-process engine;
- writing: one Ray task (one CPU) per output file runs ``shards.write_shard``; the driver records
  each completed shard in the manifest.

The counting bar's clock restarts once every actor has returned its first block, so its ETA leaves
the actors' start-up out. An input under :data:`SMALL_INPUT_BYTES` ends the run with a
:class:`SmallInputWarning` (one ``warning:`` line on the command line): the local engine is
usually faster there.

Every node must see the input files, the tokenizer folder and the output folder at the same paths
(a shared file system), and have this package installed. ``RayEngine`` joins a running cluster
(``address``), or uses the Ray session of the calling process when there is one, or starts a local
one; it shuts down only a cluster it started itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import warnings
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np

from energon_nemotron.errors import ConfigError
from energon_nemotron.megatron_packed.counting import CountMerger, Counted, count_block
from energon_nemotron.megatron_packed.encoder import MegatronSFTPackedEncoder
from energon_nemotron.megatron_packed.inputs import Block
from energon_nemotron.megatron_packed.shards import write_shard

#: bytes per counting block: the input split in about 8 blocks per actor, within these bounds
MIN_BLOCK = 1 << 20
MAX_BLOCK = 64 << 20

#: an input under this many bytes is counted faster by ``--engine local``, as a rule of thumb: the local
#: engine counts about 0.7 MB/s per core (``benchmarks/pack_scale.py``: 755 conversations/s of ~900
#: bytes) and a local Ray cluster takes about 5 s to start (``ray_cluster_start_s``) before its
#: actors load their tokenizers
SMALL_INPUT_BYTES = 8 << 20


class SmallInputWarning(UserWarning):
    """A Ray run over an input so small that the engine of this process is usually faster (Ray pays
    for starting its cluster and actors); a rule on the input's size, not a timing."""


def small_input_hint(amount: str, local: str = "local") -> str:
    """The one-line hint of a :class:`SmallInputWarning`; ``amount``: the input's size in words
    (``"0.3 MiB in 3 blocks, under 8 MiB"``), ``local``: the name of the engine of this process."""
    return (f"the input is small ({amount}): --engine {local} is usually faster here; "
            "Ray pays for starting its actors")


def restart_clock(bar: Any) -> None:
    """Restart a ``tqdm`` bar's clock now, the units it counted so far left out of its rate and ETA
    (they carry the start-up of the actors); nothing for a disabled bar or another object."""
    from tqdm import tqdm

    if not isinstance(bar, tqdm) or bar.disable:
        return
    bar.initial = bar.last_print_n = bar.n
    bar.start_t = bar.last_print_t = bar._time()
    for name in ("_ema_dn", "_ema_dt", "_ema_miniters"):
        setattr(bar, name, type(getattr(bar, name))(bar.smoothing))
    bar.refresh()

#: quiet Ray (unless verbose; values set in the environment win): the driver's C++ core worker logs
#: to stderr only at fatal level (Ray's logs stay in its session folder; Ray still says once that it
#: read the level), no usage statistics
QUIET_ENV = {"RAY_BACKEND_LOG_LEVEL": "fatal", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


def import_ray(data: bool = True) -> Any:
    """The ``ray`` module (with Ray Data when ``data``); a ``ConfigError`` saying what to install
    when it is missing."""
    try:
        import ray

        if data:
            import ray.data  # noqa: F401
    except ImportError:
        if data:
            raise ConfigError("--engine ray needs Ray Data: pip install 'energon-nemotron[ray]' "
                              "(ray[data] >= 2.60)") from None
        raise ConfigError("--engine ray needs Ray: pip install 'energon-nemotron[ray]'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: Optional[str] = None, num_cpus: Optional[int] = None, verbose: bool = False,
                data: bool = True, env: Optional[Mapping[str, str]] = None) -> Iterator[Any]:
    """The ``ray`` module (``import_ray(data)``) with a connected session: the calling process's
    when it has one (left as it is), else the cluster at ``address`` joined, else a local cluster of
    ``num_cpus`` CPUs started; a connection made here is shut down on exit (a cluster joined with
    ``address``: only this driver leaves). Quiet unless ``verbose``: no dashboard, workers' output
    not forwarded, Ray's logging at ERROR. ``env``: defaults set in the environment (values already
    set win) before Ray starts."""
    ray = import_ray(data)
    for k, v in (env or {}).items():
        os.environ.setdefault(k, v)
    if ray.is_initialized():
        yield ray
        return
    common = dict(include_dashboard=False, log_to_driver=verbose,
                  logging_level=logging.INFO if verbose else logging.ERROR)
    if address:
        ray.init(address=address, **common)
    else:
        ray.init(num_cpus=num_cpus, **common)
    try:
        yield ray
    finally:
        ray.shutdown()


class CountActor:
    """A Ray Data actor: one encoder (and tokenizer, on one thread); counts one block per call."""

    def __init__(self, encoder_options: dict, on_error: str) -> None:
        os.environ["RAYON_NUM_THREADS"] = "1"          # the actor has one CPU: tokenize on one thread
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.encoder = MegatronSFTPackedEncoder(**encoder_options)
        self.on_error = on_error

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        payloads = []
        for i in range(len(batch["block"])):
            block = Block(int(batch["block"][i]), int(batch["file"][i]), str(batch["path"][i]),
                          int(batch["start"][i]), int(batch["end"][i]))
            payloads.append(pickle.dumps(count_block(block, self.encoder, self.on_error),
                                         protocol=pickle.HIGHEST_PROTOCOL))
        return {"block": np.asarray(batch["block"]), "payload": np.array(payloads, dtype=object)}


class RayEngine:
    """Count with Ray Data actors, write with Ray tasks (see the module docstring).

    Args:
        address: a running cluster to join (``auto``, ``HOST:PORT``); None: the calling process's
            Ray session if it has one, else a local cluster started here (and shut down after).
        num_cpus: actors counting and tasks writing at once (a local cluster gets this many CPUs);
            default: every CPU of the cluster.
        verbose: Ray's own logs and Ray Data's progress bars (off by default).
    """

    name = "ray"

    def __init__(self, address: Optional[str] = None, num_cpus: Optional[int] = None, verbose: bool = False) -> None:
        if num_cpus is not None and num_cpus < 1:
            raise ConfigError(f"--num-cpus must be >= 1, got {num_cpus}")
        self.address = address
        self.num_cpus = num_cpus
        self.verbose = verbose
        self.workers = 1
        self.hint: Optional[str] = None         # a small input's hint, warned when the run ends
        self._session = contextlib.ExitStack()
        self._context: dict = {}

    def __enter__(self) -> "RayEngine":
        self.hint = None
        self._session = contextlib.ExitStack()
        ray = self._session.enter_context(ray_session(self.address, self.num_cpus, self.verbose,
                                                      env=None if self.verbose else QUIET_ENV))
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.workers = min(self.num_cpus or cpus, cpus)
        ctx = ray.data.DataContext.get_current()
        for key in ("enable_progress_bars", "print_on_execution_start"):
            self._context[key] = getattr(ctx, key)
            setattr(ctx, key, self.verbose)
        if not self.verbose:
            self._context["log_level"] = logging.getLogger("ray.data").level
            logging.getLogger("ray.data").setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        for key, value in self._context.items():       # the caller's settings back
            if key == "log_level":
                logging.getLogger("ray.data").setLevel(value)
            else:
                setattr(ctx, key, value)
        self._context = {}
        self._session.close()               # shuts down only a session this engine started
        if self.hint and exc[0] is None:
            warnings.warn(SmallInputWarning(self.hint), stacklevel=2)
        self.hint = None

    def block_size(self, total_bytes: int) -> int:
        return int(min(MAX_BLOCK, max(MIN_BLOCK, total_bytes // (8 * self.workers) + 1)))

    def count(self, blocks: list[Block], encoder: MegatronSFTPackedEncoder, on_error: str, bar) -> Counted:
        """Count every block on the actor pool; the driver merges in input order (``CountMerger``
        raises the first error in input order as soon as the blocks before it are in). ``bar``
        (``tqdm``, in bytes) gets its clock restarted once every actor has returned its first block
        (:func:`restart_clock`): its ETA leaves the actors' start-up out. An input under
        :data:`SMALL_INPUT_BYTES` sets the hint warned when the run ends."""
        import ray.data

        merger = CountMerger(blocks, on_error)
        todo = [b for b in blocks if b.size > 0]
        total = sum(b.size for b in blocks)
        if total < SMALL_INPUT_BYTES:
            self.hint = small_input_hint(f"{total / 2**20:.1f} MiB in {len(blocks)} block"
                                         f"{'s' if len(blocks) != 1 else ''}, under {SMALL_INPUT_BYTES >> 20} MiB")
        first_round = min(self.workers, len(todo))       # the blocks that carry the actors' start-up
        for b in blocks:
            if b.size == 0:                 # an empty file: nothing to send anywhere
                merger.add(count_block(b, encoder, on_error))
        if todo:
            items = [{"block": b.id, "file": b.file, "path": b.path, "start": b.start, "end": b.end} for b in todo]
            ds = ray.data.from_items(items, override_num_blocks=len(items))
            ds = ds.map_batches(CountActor, batch_size=1, batch_format="numpy",
                                fn_constructor_kwargs={"encoder_options": encoder.options(), "on_error": on_error},
                                compute=ray.data.ActorPoolStrategy(size=min(self.workers, len(todo))), num_cpus=1)
            batches = ds.iter_batches(batch_size=None, batch_format="numpy")
            try:
                returned = 0
                for batch in batches:
                    for payload in batch["payload"]:
                        count = pickle.loads(payload)
                        merger.add(count)           # raises the first error in input order
                        bar.update(blocks[count.block].size)
                        returned += 1
                        if returned == first_round:
                            restart_clock(bar)
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()                         # stops the actors now, not when the error is freed
        return merger.result()

    def write(self, paths: list[str], chat_key: str, jobs: list, on_done: Callable[[dict], None]) -> None:
        """One task per output file, at most ``workers`` + 1 submitted at a time; ``on_done`` on
        the driver as each completes."""
        import ray

        if not jobs:
            return
        task = ray.remote(num_cpus=1, max_retries=2)(write_shard)
        shared = ray.put(paths)
        queue = list(reversed(jobs))
        running = []
        while queue or running:
            while queue and len(running) < self.workers + 1:
                running.append(task.remote(shared, chat_key, queue.pop()))
            ready, running = ray.wait(running, num_returns=1)
            on_done(ray.get(ready[0]))
