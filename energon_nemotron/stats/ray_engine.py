"""``stats --engine ray``: the reading on N Ray actors, one part of every dataset each.

Actor ``r`` of ``N`` (a plain ``@ray.remote(num_cpus=1)`` actor, no Ray Data scheduling) runs
``collect.collect_part(cfg, split, r, N)``: Energon's own data parallelism (``WorkerConfig(rank=r,
world_size=N)``), or rows ``r, r+N, ...`` of a Megatron-LM file. It returns its records; the driver
merges them into dataset order (``records.merge_parts``), so the numbers equal the single-process
engine's. An actor is killed as soon as its part is back, which frees its CPU for an actor still
waiting for one.

Cluster: ``address`` joins a running one (``ray.init(address=...)``; the datasets, tokenizer and
this package must be reachable from its nodes), else a local one is started with ``num_cpus``
CPUs; a session already initialised in this process is used as it is. Ray is kept quiet (no
dashboard, workers' output not forwarded, Ray's own logging at ERROR); only a connection made here
is shut down (the session helper of the packer's Ray engine, ``megatron_packed.ray_engine.ray_session``).
N is ``num_cpus``, else the cluster's CPUs.

The progress bar (parts back) starts once an actor is up, so its ETA leaves the start-up out. Fewer
than :data:`SMALL_INPUT_SAMPLES` samples to read end the run with a ``SmallInputWarning`` (one
``warning:`` line on the command line): ``--engine single`` is usually faster there.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Optional

from energon_nemotron.config import LoaderConfig
from energon_nemotron.errors import ConfigError
from energon_nemotron.megatron_packed.ray_engine import SmallInputWarning, ray_session, small_input_hint
from energon_nemotron.stats.records import DatasetPart

#: reading fewer samples (rows) than this, as a rule of thumb, the single-process engine is done
#: before a local Ray cluster and its actors are up: on a 2-core machine it read about 1,000 text
#: samples/s, and a Ray run of 2 actors spent about 5 s more starting up (the cluster, then in every
#: actor the imports, the tokenizer and Energon's datasets), whatever the number of actors
SMALL_INPUT_SAMPLES = 5000


class PartReader:
    """The work of one actor: part ``rank`` of ``world`` of every dataset of the split."""

    def ready(self) -> bool:
        """Returns once the actor is up (its process started and this class imported)."""
        return True

    def read(self, cfg: LoaderConfig, split: str, rank: int, world: int, limit: Optional[int]) -> list[DatasetPart]:
        import warnings

        warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
        from energon_nemotron.stats.collect import collect_part

        return collect_part(cfg, split, rank, world, limit, progress=False)


def _unwrapped(ray: Any, exc: BaseException) -> BaseException:
    """An actor's own exception (a ``ConfigError`` or ``DataError`` keeps its message and type)."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    return cause if isinstance(cause, BaseException) else exc


def collect_with_ray(cfg: LoaderConfig, split: str, limit: Optional[int] = None, address: Optional[str] = None,
                     num_cpus: Optional[int] = None, progress: bool = False) -> tuple[list[list[DatasetPart]], int]:
    """(every actor's parts, in rank order; the number of actors)."""
    from tqdm import tqdm

    if num_cpus is not None and num_cpus < 1:
        raise ConfigError(f"--num-cpus must be >= 1, got {num_cpus}")
    with ray_session(address, num_cpus, data=False) as ray:
        world = num_cpus or max(1, int(ray.cluster_resources().get("CPU", 1)))
        reader = ray.remote(num_cpus=1)(PartReader)
        actors = [reader.remote() for _ in range(world)]
        ready = [actor.ready.remote() for actor in actors]
        pending = {actors[r].read.remote(cfg, split, r, world, limit): r for r in range(world)}
        parts: list[Optional[list[DatasetPart]]] = [None] * world
        try:
            ray.wait(ready, num_returns=1)  # the bar starts once an actor is up: its ETA leaves start-up out
            with tqdm(total=world, desc="readers", unit="part", disable=not progress, leave=False) as bar:
                while pending:
                    done, _ = ray.wait(list(pending), num_returns=1)
                    rank = pending.pop(done[0])
                    try:
                        parts[rank] = ray.get(done[0])
                    except Exception as e:
                        raise _unwrapped(ray, e) from None
                    ray.kill(actors[rank])
                    bar.update(1)
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
    done = [p for p in parts if p is not None]
    hint = small_input(done[0] if done else [], limit)
    if hint:
        warnings.warn(SmallInputWarning(hint), stacklevel=2)
    return done, world


def small_input(parts: list[DatasetPart], limit: Optional[int]) -> Optional[str]:
    """The hint of a small input (:data:`SMALL_INPUT_SAMPLES`), from one reader's parts (each
    dataset's ``info``: its samples or rows, at most ``limit`` of them read); None when not small."""
    rows = any("rows_in_file" in p.info for p in parts)
    sizes = [int(p.info.get("rows_in_file", p.info.get("samples_in_split", 0))) for p in parts]
    read = sum(min(n, limit) if limit is not None else n for n in sizes)
    if read >= SMALL_INPUT_SAMPLES:
        return None
    unit = "rows" if rows else "samples"
    return small_input_hint(f"{read} {unit} to read, under {SMALL_INPUT_SAMPLES}", local="single")
