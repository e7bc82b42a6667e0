"""A NeMo-RL SFT v2 master config (its ``data``, ``policy`` and ``sft`` blocks) as a ``LoaderConfig``.

``from_nemo_rl(master, tokenizer=..., dp_rank=..., dp_size=...)`` reads the config as NeMo-RL's
Energon SFT v2 loader reads it, in both shapes: **A** (main after #4105: ``data.energon.packing_buffer_size``
with ``policy.sequence_packing.{algorithm, max_sequences_per_bin}`` and
``policy.make_sequence_length_divisible_by``) and **B** (#4108: ``data.energon.task_encoder.packing``).
Interpolations are resolved first (``interpolation``). Every key gets a status (``walk``): honoured
(mapped to the library's key, listed in ``report``), the trainer's (a model or optimiser key a data
loader does not read, listed too) or refused with a ``ConfigError`` naming it and why. Absent keys
take NeMo-RL's defaults (``num_workers`` 8, ``checkpoint_every_sec`` 60, ``watchdog_timeout_seconds``
60, ...), so a config means here what it means there. The mapping, key by key, is the docs page
"Coming from NeMo-RL".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union


from energon_nemotron._energon import set_nvdataset_cache_dir
from energon_nemotron.config import LoaderConfig, load_config, read_yaml_file
from energon_nemotron.cookers.selection import CookerSelection
from energon_nemotron.errors import ConfigError
from energon_nemotron.integrations.nemo_rl.interpolation import resolve
from energon_nemotron.integrations.nemo_rl.options import encoder_options
from energon_nemotron.integrations.nemo_rl.walk import MISSING, Walk
from energon_nemotron.registry import CONFIG_READERS

__all__ = ["NemoRLConfig", "from_nemo_rl", "read_master"]

#: URL schemes of dataset paths: ``dss`` is mapped under ``nvdataset_cache_dir`` (Energon's own
#: resolution, made local so the start-up checks can read it), ``file`` to its path
_SCHEME = re.compile(r"^([a-z][a-z0-9+]*)://(.*)$")
#: NeMo-RL's Energon loader defaults (``EnergonLoaderConfig``) where a key is absent
DEFAULTS = {"num_workers": 8, "shuffle_buffer_size": 1000, "seed_offset": 0, "prefetch_factor": 2,
            "checkpoint_every_sec": 60.0, "watchdog_timeout_seconds": 60.0, "cache_pool_num_workers": 1,
            "gc_collect_every_n_steps": 100000, "max_samples_per_sequence": None}


@dataclass
class NemoRLConfig:
    """What :func:`from_nemo_rl` made: the library's ``loader`` config, the ``report`` (dotted
    NeMo-RL key -> what happened to it), the ``shape`` (``A``, ``B`` or ``unpacked``) and the
    ``identity`` NeMo-RL's loader records in its state (split, batch size, shuffle, topology,
    packing)."""

    loader: LoaderConfig
    report: dict[str, str]
    shape: str
    identity: dict = field(default_factory=dict)


def read_master(source: Union[str, Path, dict]) -> tuple[dict, str, Path]:
    """The master config as a dict, how messages name it, and the folder relative paths resolve in."""
    if isinstance(source, dict):
        return source, "nemo-rl config", Path.cwd()
    path = Path(source)
    data = read_yaml_file(path, "NeMo-RL config")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a NeMo-RL config is a mapping")
    if "defaults" in data:
        raise ConfigError(f"{path}: defaults: the config inherits from {data['defaults']!r}; pass the merged "
                          "config NeMo-RL resolves (load it with NeMo-RL's load_config and hand over the dict)")
    return data, str(path), path.parent


def _path(walk: Walk, key: str, value: Any, base: Path, cache_dir: Optional[str]) -> str:
    if not isinstance(value, str) or not value:
        walk.refuse(key, f"expected a dataset path, got {value!r}")
    m = _SCHEME.match(value)
    if m is None:
        p = Path(value)
        return str(p if p.is_absolute() else base / p)
    scheme, rest = m.groups()
    if scheme == "file":
        return rest
    if scheme == "msc":                 # object storage: kept as written, read (and checked) through Energon's EPath
        return value
    if scheme == "dss":
        if cache_dir is None:
            walk.refuse(key, f"{value!r} is a dss:// path; Energon resolves it under data.energon.nvdataset_cache_dir, "
                             "which is not set")
        name_version, _, inner = rest.partition("/")
        name, sep, version = name_version.rpartition("@")
        if not sep or not name or not version:
            walk.refuse(key, f"{value!r}: a dss:// path is dss://NAME@VERSION/PATH")
        return str(Path(cache_dir) / name / version / inner)
    walk.refuse(key, f"{value!r}: scheme {scheme}:// is not read here; the top-level source is local, file://, "
                     "msc://PROFILE/PATH (object storage through a multi-storage-client profile) or dss:// (under "
                     "nvdataset_cache_dir)")
    return ""


def _source(walk: Walk, key: str, base: Path, cache_dir: Optional[str], train: bool) -> dict:
    if not isinstance(walk.get(key), dict):
        walk.refuse(key, f"expected a source mapping {{path, split, ...}}, got {walk.get(key)!r}")
    path = _path(walk, f"{key}.path", walk.use(f"{key}.path", f"data.{'train' if train else 'validation'}.path"),
                 base, cache_dir)
    out = {"path": path, "split": walk.typed(f"{key}.split", (str,), "split", "train" if train else "val")}
    if train:
        epoch = walk.typed(f"{key}.virtual_epoch_length", (int,), "data.train.virtual_epoch_length (batches)", 0)
        if epoch < 0:
            walk.refuse(f"{key}.virtual_epoch_length", f"must be >= 0, got {epoch}")
        out["virtual_epoch_length"] = epoch
        if walk.get(f"{key}.limit") not in (MISSING, None):
            walk.refuse(f"{key}.limit", "limit caps a validation pass; a training source repeats (use "
                                        "virtual_epoch_length)")
        walk.use(f"{key}.limit", "unset (validation only)", None)
    else:
        out["limit"] = walk.typed(f"{key}.limit", (int, type(None)), "data.validation.limit (batches)", None)
        walk.use(f"{key}.virtual_epoch_length", "unset (training only)", 0)
    for k in walk.get(key):
        if k not in ("path", "split", "virtual_epoch_length", "limit"):
            walk.refuse(f"{key}.{k}", "not a key of NeMo-RL's Energon source (path, split, virtual_epoch_length, "
                                      "limit)")
    return out


def _require_false(walk: Walk, key: str) -> None:
    value = walk.get(key)
    if value is MISSING:
        walk.refuse(key, "absent means true in NeMo-RL's Energon loader, and its Nemotron encoder refuses that; "
                         "set it to false")
    if value is not False:
        walk.refuse(key, f"must be false for the Nemotron encoder (the prompt format renders the whole "
                         f"conversation), got {value!r}")
    walk.use(key, "false (the prompt format renders the conversation)")


def _choice(walk: Walk, key: str, allowed: tuple, why: str) -> None:
    value = walk.get(key, allowed[0])
    if value not in allowed:
        walk.refuse(key, f"{value!r}: only {', '.join(map(repr, allowed))} ({why})")
    walk.use(key, f"{value!r} ({why})", allowed[0])


def _loader_settings(walk: Walk, e: str, dp_rank: int, dp_size: int, batch_size: int) -> dict:
    d = DEFAULTS
    s = {"batch_size": batch_size, "dp_rank": dp_rank, "dp_size": dp_size,
         "num_workers": walk.typed(f"{e}.num_workers", (int,), "loader.num_workers", d["num_workers"]),
         "seed": walk.typed(f"{e}.seed_offset", (int,), "loader.seed", d["seed_offset"]),
         "prefetch_factor": walk.typed(f"{e}.prefetch_factor", (int,), "loader.prefetch_factor", d["prefetch_factor"]),
         "checkpoint_every_sec": walk.typed(f"{e}.checkpoint_every_sec", (int, float), "loader.checkpoint_every_sec",
                                            d["checkpoint_every_sec"]),
         "watchdog_timeout_seconds": walk.typed(f"{e}.watchdog_timeout_seconds", (int, float, type(None)),
                                                "loader.watchdog_timeout_seconds", d["watchdog_timeout_seconds"]),
         "gc_collect_every_n_steps": walk.typed(f"{e}.gc_collect_every_n_steps", (int,),
                                                "loader.gc_collect_every_n_steps", d["gc_collect_every_n_steps"]),
         "max_samples_per_sequence": walk.typed(f"{e}.max_samples_per_sequence", (int, type(None)),
                                                "loader.max_samples_per_sequence", d["max_samples_per_sequence"])}
    shuffle = walk.typed(f"{e}.shuffle_buffer_size", (int,), "loader.shuffle_buffer_size", d["shuffle_buffer_size"])
    s["shuffle_buffer_size"] = shuffle if shuffle > 1 else None       # Energon shuffles only above 1
    if walk.has(f"{e}.cache_pool_max_gbytes") or walk.has(f"{e}.cache_pool_num_workers"):
        s["cache_pool"] = {
            "max_gbytes": walk.typed(f"{e}.cache_pool_max_gbytes", (int, float, type(None)),
                                     "loader.cache_pool.max_gbytes", None),
            "num_workers": walk.typed(f"{e}.cache_pool_num_workers", (int,), "loader.cache_pool.num_workers",
                                      d["cache_pool_num_workers"])}
    return s


def _packing(walk: Walk, seq_length: int) -> tuple[Optional[dict], str]:
    """The packing section and the shape (A, B, unpacked)."""
    e = "data.energon"
    legacy = walk.get(f"{e}.packing_buffer_size", None)
    packing = walk.get(f"{e}.task_encoder.packing", None) if isinstance(walk.get(f"{e}.task_encoder"), dict) else None
    if legacy is not None and packing is not None:
        walk.refuse(f"{e}.packing_buffer_size", "set together with task_encoder.packing: shape B keeps this field "
                                                "null (packing is configured by task_encoder.packing)")
    sp = "policy.sequence_packing"
    if packing is None and legacy is None:
        walk.use(f"{e}.packing_buffer_size", "null: no packing (one conversation per row)", None)
        for k in ("algorithm", "max_sequences_per_bin"):
            walk.trainer(f"{sp}.{k}", "NeMo-RL's own packer of unpacked batches; the loader does not pack")
        return None, "unpacked"
    if packing is None:                                                    # shape A
        buffer = walk.typed(f"{e}.packing_buffer_size", (int,), "packing.buffer_size")
        algo = walk.typed(f"{sp}.algorithm", (str,), "packing.algorithm", "modified_first_fit_decreasing")
        cap = walk.typed(f"{sp}.max_sequences_per_bin", (int, type(None)), "packing.max_sequences_per_bin", None)
        pad = walk.typed("policy.make_sequence_length_divisible_by", (int,), "packing.pad_multiple", 1)
        return {"algorithm": algo, "buffer_size": buffer, "max_sequences_per_bin": cap, "pad_multiple": pad}, "A"
    p = f"{e}.task_encoder.packing"                                        # shape B
    walk.use(f"{e}.packing_buffer_size", "null (shape B: task_encoder.packing configures packing)", None)
    for k in walk.get(p):
        if k not in ("name", "buffer_size", "options"):
            walk.refuse(f"{p}.{k}", "not a key of NeMo-RL's packing config (name, buffer_size, options)")
    for k in walk.get(f"{p}.options", {}) or {}:
        if k not in ("max_sequence_length", "sequence_length_pad_multiple", "max_sequences_per_bin",
                     "balanced_knapsack_delta"):
            walk.refuse(f"{p}.options.{k}", "not a packing option (max_sequence_length, sequence_length_pad_multiple, "
                                            "max_sequences_per_bin, balanced_knapsack_delta)")
    out = {"algorithm": walk.typed(f"{p}.name", (str,), "packing.algorithm"),
           "buffer_size": walk.typed(f"{p}.buffer_size", (int,), "packing.buffer_size"),
           "pad_multiple": walk.typed(f"{p}.options.sequence_length_pad_multiple", (int,), "packing.pad_multiple", 1),
           "max_sequences_per_bin": walk.typed(f"{p}.options.max_sequences_per_bin", (int, type(None)),
                                               "packing.max_sequences_per_bin", None)}
    length = walk.typed(f"{p}.options.max_sequence_length", (int,), "task_encoder.options.seq_length (checked)",
                        seq_length)
    if length != seq_length:
        walk.refuse(f"{p}.options.max_sequence_length", f"{length} differs from data.max_input_seq_length "
                                                        f"{seq_length}: the pack capacity is the sequence length")
    delta = walk.typed(f"{p}.options.balanced_knapsack_delta", (int, type(None)), "packing.balanced_knapsack_delta",
                       None)
    if delta is not None:
        if out["algorithm"] != "balanced_greedy_knapsack":
            walk.refuse(f"{p}.options.balanced_knapsack_delta", f"applies to balanced_greedy_knapsack only, not "
                                                                f"{out['algorithm']!r}")
        out["balanced_knapsack_delta"] = delta
    if seq_length % out["pad_multiple"]:
        walk.refuse(f"{p}.options.sequence_length_pad_multiple", f"{out['pad_multiple']} does not divide the pack "
                                                                 f"capacity {seq_length}")
    for k in ("algorithm", "max_sequences_per_bin"):
        walk.trainer(f"{sp}.{k}", "shape A's packing keys; in shape B task_encoder.packing configures packing")
    return out, "B"


def _cookers(walk: Walk) -> list[dict]:
    key = "data.energon.cookers"
    rules = walk.get(key, [{"name": "generic_conversation"}])
    if not isinstance(rules, list):
        walk.refuse(key, f"expected a list of {{name, options, has_subflavors}}, got {rules!r}")
    out = []
    for i, rule in enumerate(rules):
        at = f"{key}[{i}]"
        if not isinstance(rule, dict):
            walk.refuse(at, f"expected {{name, options, has_subflavors}}, got {rule!r}")
        walk.entry_keys(at, rule, ("name", "options", "has_subflavors"), "cooker",
                        "register the cooker under the energon_nemotron.cookers entry point")
        out.append({"name": rule.get("name", "generic_conversation"), "options": rule.get("options") or {},
                    "has_subflavors": rule.get("has_subflavors")})
        walk.report[at] = f"honoured: data.cookers[{i}] ({out[-1]['name']})"
    CookerSelection(out, where=f"{walk.origin}: {key}")     # names, options, filters: checked under the user's key
    return out


def _parallel(walk: Walk) -> dict:
    m = "policy.megatron_cfg"
    out = {"context_parallel_size": walk.typed(f"{m}.context_parallel_size", (int,),
                                               "task_encoder.options.context_parallel_size", 1),
           "tensor_parallel_size": walk.typed(f"{m}.tensor_model_parallel_size", (int,),
                                              "task_encoder.options.tensor_parallel_size", 1),
           "sequence_parallel": walk.typed(f"{m}.sequence_parallel", (bool,), "task_encoder.options.sequence_parallel",
                                           False),
           "mtp_num_layers": walk.typed(f"{m}.mtp_num_layers", (int, type(None)), "task_encoder.options.mtp_num_layers",
                                        0) or 0}
    env = walk.get(f"{m}.env_vars", {}) or {}
    mode = env.get("NRL_MEDIA_PREPROCESSING_MODE", "patchify")
    if mode != "patchify":
        walk.refuse(f"{m}.env_vars.NRL_MEDIA_PREPROCESSING_MODE", f"{mode!r}: the nemo_rl_packed output carries "
                                                                  "pixels in patchify mode only")
    walk.use(f"{m}.env_vars.NRL_MEDIA_PREPROCESSING_MODE", "patchify: the output's pixel layout", "patchify")
    if "NRL_MEDIA_PATCH_DIM" in env:
        walk.use(f"{m}.env_vars.NRL_MEDIA_PATCH_DIM", "checked against task_encoder.options.patch_dim")
    return out


def _batch_size(walk: Walk, dp_size: int) -> int:
    gbs = walk.typed("policy.train_global_batch_size", (int,), "loader.batch_size (= gbs / DP size)")
    if gbs % dp_size:
        walk.refuse("policy.train_global_batch_size", f"{gbs} does not divide by the DP size {dp_size} (each DP "
                                                      "rank's loader yields gbs / DP rows per step)")
    return gbs // dp_size


def _policy_checks(walk: Walk, packed: bool) -> None:
    sp = "policy.sequence_packing"
    if packed:
        for k in ("enabled", "fuse_loss"):
            if walk.get(f"{sp}.{k}", False) is not True:
                walk.refuse(f"{sp}.{k}", "must be true: NeMo-RL's Megatron policy takes Energon-packed batches only "
                                         "with fused sequence packing (megatron/data.py)")
            walk.use(f"{sp}.{k}", "true (required for packed batches)")
        if walk.get("policy.dynamic_batching.enabled", False):
            walk.refuse("policy.dynamic_batching.enabled", "must be false with Energon-packed batches")
    walk.use("policy.dynamic_batching.enabled", "false (checked)", False)
    template = walk.get("policy.tokenizer.chat_template", None)
    if template not in (None, "default"):
        walk.refuse("policy.tokenizer.chat_template", "a template other than the tokenizer's: the prompt format "
                                                      "(task_encoder.options.prompt_format) renders conversations")
    walk.use("policy.tokenizer.chat_template", "the tokenizer's (prompt_format decides)", None)


def _tokenizer(walk: Walk, tokenizer: Optional[Union[str, Path]], base: Path) -> str:
    name = walk.get("policy.tokenizer.name", None)
    if tokenizer is not None:
        walk.trainer("policy.tokenizer.name", "the tokenizer passed to from_nemo_rl is used")
        return str(tokenizer)
    if isinstance(name, str):
        path = Path(name) if Path(name).is_absolute() else base / name
        if path.is_dir():
            walk.use("policy.tokenizer.name", "tokenizer (a local folder)")
            return str(path)
    walk.refuse("policy.tokenizer.name", f"{name!r} is not a local tokenizer folder (nothing is downloaded); pass "
                                         "tokenizer=PATH (--tokenizer on the command line)")
    return ""


def from_nemo_rl(master: Union[str, Path, dict], *, tokenizer: Optional[Union[str, Path]] = None,
                 dp_rank: int = 0, dp_size: int = 1) -> NemoRLConfig:
    """The library's loader config for one logical DP rank of a NeMo-RL SFT v2 master config (a dict
    or a YAML path); see the module docstring. ``tokenizer``: a local tokenizer folder (default:
    ``policy.tokenizer.name`` when that is one)."""
    raw, origin, base = read_master(master)
    walk = Walk(resolve(raw), origin)
    if not 0 <= dp_rank < dp_size:
        raise ConfigError(f"invalid dp_rank={dp_rank} / dp_size={dp_size}")
    if walk.get("data.backend", None) != "energon":
        walk.refuse("data.backend", f"{walk.get('data.backend', None)!r}: SFT v2's Energon loader needs energon")
    walk.use("data.backend", "energon")
    walk.use("data._override_", "a NeMo-RL config-merge marker: nothing to load", None)
    e = "data.energon"
    if not isinstance(walk.get(e), dict):
        walk.refuse(e, "required: the Energon loader block")
    family = walk.get(f"{e}.model_family", MISSING)
    if family != "nemotron":
        walk.refuse(f"{e}.model_family", f"{family if family is not MISSING else 'missing'}: this library's encoder "
                                         "is Nemotron's (model_family: nemotron)")
    walk.use(f"{e}.model_family", "nemotron (the nemotron_multimodal encoder)")
    for k, allowed, why in (("batch_grouping", ("auto",), "batches group by encoder"),
                            ("processor_adapter", ("hf_multimodal",), "the encoder tokenizes and plans media itself"),
                            ("topology_mapper", ("default",), "the DP rank/size given here")):
        _choice(walk, f"{e}.{k}", allowed, why)
    seq_length = walk.typed("data.max_input_seq_length", (int,), "task_encoder.options.seq_length")
    total = walk.get("policy.max_total_sequence_length", seq_length)
    if total != seq_length:
        walk.refuse("policy.max_total_sequence_length", f"{total} differs from data.max_input_seq_length {seq_length}")
    walk.use("policy.max_total_sequence_length", "checked equal to data.max_input_seq_length", seq_length)
    for k in ("add_bos", "add_eos", "add_generation_prompt"):
        _require_false(walk, f"data.{k}")
    if walk.get("data.shuffle", None) is not True:
        walk.refuse("data.shuffle", "NeMo-RL's Energon training requires shuffle: true")
    walk.use("data.shuffle", "true (loader.shuffle_buffer_size shuffles)")
    cache_dir = walk.typed(f"{e}.nvdataset_cache_dir", (str, type(None)), "the root of dss:// paths", None)
    if cache_dir is not None:
        cache_dir = str(Path(cache_dir) if Path(cache_dir).is_absolute() else base / cache_dir)
        set_nvdataset_cache_dir(Path(cache_dir))
    train = _source(walk, "data.train", base, cache_dir, train=True)
    validation = walk.get("data.validation", None)
    if validation is not None:
        validation = _source(walk, "data.validation", base, cache_dir, train=False)
    else:
        walk.use("data.validation", "null", None)
    packing, shape = _packing(walk, seq_length)
    options = {"seq_length": seq_length, **_parallel(walk), **encoder_options(walk, seq_length)}
    only_final = walk.typed("sft.only_unmask_final", (bool,), "task_encoder.options.train_only_on_last_assistant_turn",
                            False)
    options["train_only_on_last_assistant_turn"] = only_final
    _policy_checks(walk, packing is not None)
    batch_size = _batch_size(walk, dp_size)
    settings = _loader_settings(walk, e, dp_rank, dp_size, batch_size)
    cookers = _cookers(walk)
    walk.report["data.energon.cookers"] = f"honoured: data.cookers ({len(cookers)} entries)"
    config = {"tokenizer": _tokenizer(walk, tokenizer, base),
              "task_encoder": {"name": "nemotron_multimodal", "options": options},
              "packing": packing,
              "data": {"train": train, "validation": validation, "cookers": cookers, "other_subflavors": "allow"},
              "loader": settings}
    report = walk.finish()
    loader = load_config(config, base=base)
    identity = {"split_role": "train", "batch_size": batch_size, "shuffle": True,
                "topology": {"mapper": "default", "logical_rank": dp_rank, "logical_world_size": dp_size},
                "only_unmask_final": only_final,
                **({"packing_algorithm": packing["algorithm"], "max_sequences_per_bin": packing["max_sequences_per_bin"],
                    "sequence_length_pad_multiple": packing["pad_multiple"]} if packing else {})}
    if not math.isfinite(float(settings["checkpoint_every_sec"])):
        raise ConfigError(f"{origin}: data.energon.checkpoint_every_sec: expected a finite number")
    return NemoRLConfig(loader, report, shape, identity)


@CONFIG_READERS.register("nemo_rl")
def read_nemo_rl(path: Union[str, Path], tokenizer: Optional[Union[str, Path]], dp_rank: int, dp_size: int) -> LoaderConfig:
    """The command line's ``--nemo-rl CONFIG.yaml``: the loader config of :func:`from_nemo_rl`."""
    return from_nemo_rl(path, tokenizer=tokenizer, dp_rank=dp_rank, dp_size=dp_size).loader
