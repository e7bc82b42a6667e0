"""The YAML loader config: its pydantic models and :func:`load_config` (``models``), and the
value-type vocabulary every config message uses (``values``). docs/loader_config.md lists the fields."""

from energon_nemotron.config.models import (FIELD_HINTS, SOURCE_HINT, BalanceConfig, CachePoolConfig, CarryConfig,
                                            CookerSpec, DataConfig, EnergonSource, LoaderConfig, LoaderSettings,
                                            MegatronSource, PackingConfig, Source, StrictModel, TaskEncoderConfig,
                                            format_validation_error, load_config, read_yaml_file)
from energon_nemotron.config.values import check_dataclass_values, describe_value, type_check

__all__ = ["BalanceConfig", "CachePoolConfig", "CarryConfig", "CookerSpec", "DataConfig", "EnergonSource",
           "LoaderConfig", "LoaderSettings", "MegatronSource", "PackingConfig", "Source", "StrictModel",
           "TaskEncoderConfig", "FIELD_HINTS", "SOURCE_HINT", "format_validation_error", "load_config",
           "read_yaml_file", "check_dataclass_values", "describe_value", "type_check"]
